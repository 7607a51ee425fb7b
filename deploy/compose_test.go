// Package deploy checks the container files at the repository root (docker-compose.yml,
// Dockerfile, .dockerignore) against the code they run, since no Docker engine runs them in CI.
package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const root = ".." // the module root, from this package's directory

// stringOrList is a compose field that may be written as a string or a list of strings
// (command, entrypoint, healthcheck.test). A string is kept as one element: compose splits it
// shell-style, which none of our checks need.
type stringOrList []string

func (s *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*s = stringOrList{n.Value}
		return nil
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		*s = l
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings", n.Line)
}

// envMap is environment: as a mapping or as a list of KEY=VALUE.
type envMap map[string]string

func (e *envMap) UnmarshalYAML(n *yaml.Node) error {
	out := envMap{}
	switch n.Kind {
	case yaml.MappingNode:
		var m map[string]string
		if err := n.Decode(&m); err != nil {
			return err
		}
		for k, v := range m {
			out[k] = v
		}
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, kv := range l {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment must be a mapping or a list", n.Line)
	}
	*e = out
	return nil
}

// dependsOn is depends_on: a list of names or a mapping of name to {condition}.
type dependsOn map[string]string // service -> condition

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	out := dependsOn{}
	switch n.Kind {
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, s := range l {
			out[s] = "service_started"
		}
	case yaml.MappingNode:
		var m map[string]struct {
			Condition string `yaml:"condition"`
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		for s, c := range m {
			if c.Condition == "" {
				c.Condition = "service_started"
			}
			out[s] = c.Condition
		}
	default:
		return fmt.Errorf("line %d: depends_on must be a list or a mapping", n.Line)
	}
	*d = out
	return nil
}

// build is build: a context path or {context, dockerfile}.
type build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func (b *build) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain build
	dec := plain{}
	if err := n.Decode(&dec); err != nil {
		return err
	}
	*b = build(dec)
	return nil
}

type healthcheck struct {
	Test        stringOrList `yaml:"test"`
	Interval    string       `yaml:"interval"`
	Timeout     string       `yaml:"timeout"`
	Retries     int          `yaml:"retries"`
	StartPeriod string       `yaml:"start_period"`
}

// service lists every key the compose file may use. Decoding is strict, so a misspelt key
// (depend_on, enviroment) fails the test instead of being silently ignored as it would be by
// a lenient reader. A real compose key not listed here needs adding.
type service struct {
	Image       string       `yaml:"image"`
	Build       *build       `yaml:"build"`
	Platform    string       `yaml:"platform"`
	Init        bool         `yaml:"init"`
	Entrypoint  stringOrList `yaml:"entrypoint"`
	Command     stringOrList `yaml:"command"`
	Environment envMap       `yaml:"environment"`
	Ports       []string     `yaml:"ports"`
	Volumes     []string     `yaml:"volumes"`
	DependsOn   dependsOn    `yaml:"depends_on"`
	Healthcheck *healthcheck `yaml:"healthcheck"`
	Profiles    []string     `yaml:"profiles"`
	Restart     string       `yaml:"restart"`
}

type composeFile struct {
	Name     string             `yaml:"name"`
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var c composeFile
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return &c
}

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// facilitatorSource is the non-test Go source of cmd/facilitator, where flags and
// environment variables are read.
func facilitatorSource(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "cmd", "facilitator", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sb.Write(b)
		sb.WriteByte('\n')
	}
	if sb.Len() == 0 {
		t.Fatal("no Go source in cmd/facilitator")
	}
	return sb.String()
}

// subcommands are the names main.go dispatches on (case "serve": ...).
func subcommands(t *testing.T) []string {
	t.Helper()
	src := readRepoFile(t, "cmd/facilitator/main.go")
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*case\s+("[^:]*):`).FindAllStringSubmatch(src, -1) {
		for _, q := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(m[1], -1) {
			out = append(out, q[1])
		}
	}
	if len(out) == 0 {
		t.Fatal(`found no case "..." lines in cmd/facilitator/main.go`)
	}
	return out
}

// definesFlag reports whether src defines a flag called name on a FlagSet named fs, as in
// fs.Int("anvil-port", ...) or fs.StringVar(&cfg.Listen, "listen", ...).
func definesFlag(src, name string) bool {
	re := regexp.MustCompile(`fs\.[A-Za-z0-9]+\(\s*(?:&[^,]+,\s*)?"` + regexp.QuoteMeta(name) + `"`)
	return re.MatchString(src)
}

// imagePinned reports whether ref names a tag other than latest, or a digest.
func imagePinned(ref string) bool {
	if strings.Contains(ref, "@sha256:") {
		return true
	}
	name := ref[strings.LastIndex(ref, "/")+1:]
	_, tag, ok := strings.Cut(name, ":")
	return ok && tag != "" && tag != "latest" && !strings.Contains(tag, "$")
}

// containerPorts are the container sides of short-syntax port mappings
// ("127.0.0.1:4021:4021", "4021:4021", "4021").
func containerPorts(ports []string) []string {
	var out []string
	for _, p := range ports {
		p, _, _ = strings.Cut(p, "/") // protocol
		out = append(out, p[strings.LastIndex(p, ":")+1:])
	}
	return out
}

// flagValue finds --name value or --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name || a == "-"+name {
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", false
		}
		for _, prefix := range []string{"--" + name + "=", "-" + name + "="} {
			if v, ok := strings.CutPrefix(a, prefix); ok {
				return v, true
			}
		}
	}
	return "", false
}

func TestComposeServices(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"postgres", "anvil", "facilitator"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("service %q is missing", name)
		}
	}
	for name, s := range c.Services {
		switch {
		case s.Image == "" && s.Build == nil:
			t.Errorf("service %s has neither image nor build", name)
		case s.Build != nil:
			ctx := s.Build.Context
			if ctx == "" {
				ctx = "."
			}
			df := s.Build.Dockerfile
			if df == "" {
				df = "Dockerfile"
			}
			if _, err := os.Stat(filepath.Join(root, ctx, df)); err != nil {
				t.Errorf("service %s builds %s in context %s, which does not exist: %v", name, df, ctx, err)
			}
		}
		if s.Image != "" && s.Build == nil && !imagePinned(s.Image) {
			t.Errorf("service %s: image %q is not pinned to a tag (and latest does not count)", name, s.Image)
		}
		for dep, cond := range s.DependsOn {
			target, ok := c.Services[dep]
			if !ok {
				t.Errorf("service %s depends on %s, which is not a service", name, dep)
				continue
			}
			switch cond {
			case "service_started", "service_completed_successfully":
			case "service_healthy":
				if target.Healthcheck == nil {
					t.Errorf("service %s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
				}
			default:
				t.Errorf("service %s: depends_on %s has unknown condition %q", name, dep, cond)
			}
			// A dependency that is off by default breaks every `up` of the dependent.
			for _, p := range target.Profiles {
				if !slices.Contains(s.Profiles, p) {
					t.Errorf("service %s depends on %s, which only runs under profile %s", name, dep, p)
				}
			}
		}
		if hc := s.Healthcheck; hc != nil {
			if len(hc.Test) == 0 || !slices.Contains([]string{"CMD", "CMD-SHELL", "NONE"}, hc.Test[0]) {
				t.Errorf("service %s: healthcheck test must be a list starting with CMD, CMD-SHELL or NONE, got %q", name, hc.Test)
			}
		}
		for _, v := range s.Volumes {
			src, _, ok := strings.Cut(v, ":")
			if !ok || strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") || strings.HasPrefix(src, "~") {
				continue // bind mount or anonymous volume
			}
			if _, ok := c.Volumes[src]; !ok {
				t.Errorf("service %s mounts volume %s, which is not declared under the top-level volumes", name, src)
			}
		}
	}
}

func TestComposePostgres(t *testing.T) {
	pg, ok := loadCompose(t).Services["postgres"]
	if !ok {
		t.Fatal("no postgres service")
	}
	for _, k := range []string{"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"} {
		if pg.Environment[k] == "" {
			t.Errorf("postgres: %s is not set", k)
		}
	}
	if pg.Healthcheck == nil || !slices.Contains(pg.Healthcheck.Test, "pg_isready") {
		t.Error("postgres: the healthcheck should run pg_isready")
	}
	if !slices.ContainsFunc(pg.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/var/lib/postgresql/data") }) {
		t.Error("postgres: no volume at /var/lib/postgresql/data")
	}
}

func TestComposeFacilitator(t *testing.T) {
	c := loadCompose(t)
	f, ok := c.Services["facilitator"]
	if !ok {
		t.Fatal("no facilitator service")
	}
	if f.Build == nil {
		t.Error("facilitator: should be built from this repository's Dockerfile")
	}
	if len(f.Entrypoint) > 0 {
		t.Errorf("facilitator: entrypoint %q overrides the image's; the command should be a subcommand", f.Entrypoint)
	}
	if len(f.Command) == 0 {
		t.Fatal("facilitator: no command")
	}
	cmds := subcommands(t)
	sub := f.Command[0]
	if !slices.Contains(cmds, sub) || sub == "help" || strings.HasPrefix(sub, "-") {
		t.Fatalf("facilitator: command starts with %q; cmd/facilitator/main.go handles %q", sub, cmds)
	}
	src := facilitatorSource(t)
	for _, a := range f.Command[1:] {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !definesFlag(src, name) {
			t.Errorf("facilitator: flag %s is not defined in cmd/facilitator", a)
		}
	}
	// Where it listens must be reachable from outside the container and published.
	listen, ok := flagValue(f.Command, "listen")
	if !ok {
		listen = f.Environment["FACILITATOR_LISTEN"]
	}
	if listen == "" {
		t.Error("facilitator: no --listen (serve's and dev's default, 127.0.0.1, is unreachable from outside the container)")
	} else {
		host, port, _ := strings.Cut(listen, ":")
		if host == "127.0.0.1" || host == "localhost" {
			t.Errorf("facilitator: listens on %s, unreachable from outside the container", listen)
		}
		if !slices.Contains(containerPorts(f.Ports), port) {
			t.Errorf("facilitator: listens on port %s, which is not published (ports %q)", port, f.Ports)
		}
	}
	for k := range f.Environment {
		if strings.HasPrefix(k, "FACILITATOR_") || k == "DATABASE_URL" {
			if !strings.Contains(src, `"`+k+`"`) {
				t.Errorf("facilitator: environment variable %s is not read anywhere in cmd/facilitator", k)
			}
		}
	}
	if sub == "serve" || sub == "dev" || sub == "migrate" {
		if _, ok := f.Environment["DATABASE_URL"]; !ok {
			if _, ok := flagValue(f.Command, "database-url"); !ok {
				t.Errorf("facilitator: %s needs DATABASE_URL", sub)
			}
		}
	}
	if url := f.Environment["DATABASE_URL"]; url != "" {
		// postgres://user:pass@HOST:port/db: HOST must be a service this one waits for.
		_, rest, _ := strings.Cut(url, "@")
		host, _, _ := strings.Cut(rest, ":")
		if _, ok := c.Services[host]; !ok {
			t.Errorf("facilitator: DATABASE_URL points at host %q, which is not a service", host)
		} else if _, ok := f.DependsOn[host]; !ok {
			t.Errorf("facilitator: DATABASE_URL points at %s, but the facilitator does not depend on it", host)
		}
	}
}

func TestComposeAnvil(t *testing.T) {
	a, ok := loadCompose(t).Services["anvil"]
	if !ok {
		t.Fatal("no anvil service")
	}
	if !slices.Contains(a.Profiles, "chain-only") {
		t.Errorf("anvil: should run only under the chain-only profile, has profiles %q", a.Profiles)
	}
	// The foundry image's entrypoint is a shell, so anvil must be named explicitly.
	args := append(slices.Clone(a.Entrypoint), a.Command...)
	if len(args) == 0 || args[0] != "anvil" {
		t.Fatalf("anvil: runs %q, want anvil as the entrypoint", args)
	}
	if h, _ := flagValue(args, "host"); h != "0.0.0.0" {
		t.Errorf("anvil: --host is %q; anvil listens on 127.0.0.1 by default, unreachable from outside the container", h)
	}
	port, ok := flagValue(args, "port")
	if !ok {
		port = "8545"
	}
	if !slices.Contains(containerPorts(a.Ports), port) {
		t.Errorf("anvil: port %s is not published (ports %q)", port, a.Ports)
	}
	// The standalone chain should be the same anvil release the facilitator image gets from npm.
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal([]byte(readRepoFile(t, "package.json")), &pkg); err != nil {
		t.Fatal(err)
	}
	want := "v" + pkg.Dependencies["@foundry-rs/anvil-linux-amd64"]
	if _, tag, _ := strings.Cut(path.Base(a.Image), ":"); tag != want {
		t.Errorf("anvil: image %s, want the tag %s that matches package.json's anvil", a.Image, want)
	}
}

// dockerfileInstructions returns the Dockerfile's instructions with continuation lines joined.
func dockerfileInstructions(t *testing.T) [][]string {
	t.Helper()
	var out [][]string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(readRepoFile(t, "Dockerfile")))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, strings.Fields(cur.String()))
		cur.Reset()
	}
	if len(out) == 0 {
		t.Fatal("Dockerfile has no instructions")
	}
	return out
}

func TestDockerfile(t *testing.T) {
	ins := dockerfileInstructions(t)
	stages := map[string]bool{}
	var (
		builds, copiesPkg, copiesLock, npmCI bool
		entrypoint, user                     string
		env                                  []string
	)
	for _, in := range ins {
		args := in[1:]
		switch strings.ToUpper(in[0]) {
		case "FROM":
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				args = args[1:]
			}
			if len(args) == 0 {
				t.Errorf("FROM without an image: %q", in)
				continue
			}
			if !stages[args[0]] && !imagePinned(args[0]) {
				t.Errorf("FROM %s: not a tagged image (latest does not count)", args[0])
			}
			if len(args) == 3 && strings.EqualFold(args[1], "AS") {
				stages[args[2]] = true
			}
		case "RUN":
			line := strings.Join(args, " ")
			if strings.Contains(line, "go build") && slices.Contains(args, "./cmd/facilitator") {
				builds = true
			}
			if strings.Contains(line, "npm ci") {
				npmCI = true
			}
		case "COPY":
			for _, a := range args {
				if from, ok := strings.CutPrefix(a, "--from="); ok && !stages[from] {
					t.Errorf("COPY --from=%s: no earlier stage has that name", from)
				}
			}
			copiesPkg = copiesPkg || slices.Contains(args, "package.json")
			copiesLock = copiesLock || slices.Contains(args, "package-lock.json")
		case "ENTRYPOINT":
			entrypoint = strings.Join(args, " ")
		case "USER":
			user = strings.Join(args, " ")
		case "ENV":
			for _, a := range args {
				if k, _, ok := strings.Cut(a, "="); ok {
					env = append(env, k)
				}
			}
		}
	}
	if !builds {
		t.Error("Dockerfile: no RUN go build ... ./cmd/facilitator")
	}
	if !copiesPkg || !copiesLock {
		t.Error("Dockerfile: package.json and package-lock.json must be copied (facilitator dev needs node_modules)")
	}
	if !npmCI {
		t.Error("Dockerfile: no npm ci (the lockfile's pinned versions)")
	}
	if !strings.Contains(entrypoint, "/usr/local/bin/facilitator") {
		t.Errorf("Dockerfile: ENTRYPOINT %q does not run /usr/local/bin/facilitator", entrypoint)
	}
	if user == "" || user == "root" || user == "0" || strings.HasPrefix(user, "0:") {
		t.Errorf("Dockerfile: the last USER is %q; the image should run as a non-root user", user)
	}
	src := facilitatorSource(t)
	for _, k := range env {
		if strings.HasPrefix(k, "FACILITATOR_") && !strings.Contains(src, `"`+k+`"`) {
			t.Errorf("Dockerfile: ENV %s is not read anywhere in cmd/facilitator", k)
		}
	}
}

// TestDockerignore checks that the build context keeps what the build needs: the module files,
// the npm manifests, and the files cmd/facilitator's packages embed.
func TestDockerignore(t *testing.T) {
	var patterns []string
	for _, l := range strings.Split(readRepoFile(t, ".dockerignore"), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") || strings.Contains(l, "**") {
			t.Fatalf(".dockerignore: %q is beyond this test's simple matcher; extend the test", l)
		}
		patterns = append(patterns, strings.TrimPrefix(path.Clean(l), "/"))
	}
	needed := []string{
		"go.mod", "go.sum", "package.json", "package-lock.json",
		"cmd/facilitator/main.go", "migrations/0001_networks.up.sql",
		"devchain/solc.mjs", "devchain/testdata/SmartWallet.sol",
	}
	for _, n := range needed {
		if _, err := os.Stat(filepath.Join(root, n)); err != nil {
			t.Errorf("%s: %v (update this list if it moved)", n, err)
			continue
		}
		// A pattern excludes a path if it matches the path or one of its parent directories.
		for p := n; p != "."; p = path.Dir(p) {
			for _, pat := range patterns {
				if ok, _ := path.Match(pat, p); ok {
					t.Errorf(".dockerignore: %q excludes %s, which the image build needs", pat, n)
				}
			}
		}
	}
}
