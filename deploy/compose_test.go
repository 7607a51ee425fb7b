// Package deploy checks the container files at the repository root (docker-compose.yml,
// Dockerfile, .dockerignore) against the code they run, since no Docker engine runs them in CI.
package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
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
	Target     string `yaml:"target"`
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

// commandOf is the command an image target runs: the Dockerfile's dev stage runs the dev
// binary, every other target (the default, serve) the production one.
func commandOf(target string) string {
	if target == "dev" {
		return "cmd/facilitator-dev"
	}
	return "cmd/facilitator"
}

// facilitatorSource is the non-test Go source of cmd/facilitator, where flags and
// environment variables are read.
func facilitatorSource(t *testing.T) string {
	t.Helper()
	return commandSource(t, "cmd/facilitator")
}

// commandSource is the non-test Go source of a command's folder.
func commandSource(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
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
		t.Fatalf("no Go source in %s", dir)
	}
	return sb.String()
}

// subcommands are the names a command's main.go dispatches on (case "serve": ...).
func subcommands(t *testing.T, dir string) []string {
	t.Helper()
	src := readRepoFile(t, dir+"/main.go")
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*case\s+("[^:]*):`).FindAllStringSubmatch(src, -1) {
		for _, q := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(m[1], -1) {
			out = append(out, q[1])
		}
	}
	if len(out) == 0 {
		t.Fatalf(`found no case "..." lines in %s/main.go`, dir)
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
	// The local stack is the dev image's: its target must be a stage of the Dockerfile.
	if f.Build != nil && f.Build.Target != "" && !slices.Contains(dockerStages(t), f.Build.Target) {
		t.Errorf("facilitator: build target %q is not a stage of the Dockerfile (%q)", f.Build.Target, dockerStages(t))
	}
	dir := "cmd/facilitator"
	if f.Build != nil {
		dir = commandOf(f.Build.Target)
	}
	cmds := subcommands(t, dir)
	sub := f.Command[0]
	if !slices.Contains(cmds, sub) || sub == "help" || strings.HasPrefix(sub, "-") {
		t.Fatalf("facilitator: command starts with %q; %s/main.go handles %q", sub, dir, cmds)
	}
	src := commandSource(t, dir)
	for _, a := range f.Command[1:] {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !definesFlag(src, name) {
			t.Errorf("facilitator: flag %s is not defined in %s", a, dir)
		}
	}
	// The healthcheck runs the production binary's probe, the one binary in every image.
	if hc := f.Healthcheck; hc != nil && len(hc.Test) > 2 && hc.Test[0] == "CMD" && strings.HasSuffix(hc.Test[1], "/facilitator") {
		if !slices.Contains(subcommands(t, "cmd/facilitator"), hc.Test[2]) {
			t.Errorf("facilitator: the healthcheck runs facilitator %q, which cmd/facilitator/main.go does not handle", hc.Test[2])
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
	// The healthcheck asks the port serve listens on (its comment says so).
	if hc := f.Healthcheck; hc != nil && listen != "" {
		if u, ok := flagValue(hc.Test, "url"); ok {
			_, port, _ := strings.Cut(listen, ":")
			if hp := regexp.MustCompile(`^https?://[^/:]+:([0-9]+)/`).FindStringSubmatch(u); hp == nil || hp[1] != port {
				t.Errorf("facilitator: the healthcheck asks %s, not --listen's port %s", u, port)
			}
		}
	}
	// anvil's published port answers from the host only if anvil binds beyond the loopback.
	if sub == "dev" {
		port, ok := flagValue(f.Command, "anvil-port")
		if !ok {
			port = "8545"
		}
		if slices.Contains(containerPorts(f.Ports), port) {
			if host, _ := flagValue(f.Command, "anvil-host"); host == "" || host == "127.0.0.1" || host == "localhost" {
				t.Errorf("facilitator: publishes anvil's port %s, but anvil binds %q (--anvil-host; default 127.0.0.1), unreachable from outside the container", port, host)
			}
		}
	}
	for k := range f.Environment {
		if strings.HasPrefix(k, "FACILITATOR_") || k == "DATABASE_URL" {
			if !strings.Contains(src, `"`+k+`"`) {
				t.Errorf("facilitator: environment variable %s is not read anywhere in %s", k, dir)
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

// TestComposeCommentURLs: each loopback URL the compose file's comments promise
// (http://127.0.0.1:4021) is a port some service publishes on the host.
func TestComposeCommentURLs(t *testing.T) {
	c := loadCompose(t)
	published := map[string]bool{}
	for _, s := range c.Services {
		for _, p := range s.Ports {
			p, _, _ = strings.Cut(p, "/")
			parts := strings.Split(p, ":")
			if len(parts) >= 2 {
				published[parts[len(parts)-2]] = true
			}
		}
	}
	re := regexp.MustCompile(`https?://(?:127\.0\.0\.1|localhost):([0-9]+)`)
	for i, line := range strings.Split(readRepoFile(t, "docker-compose.yml"), "\n") {
		_, comment, ok := strings.Cut(line, "#")
		if !ok {
			continue
		}
		for _, m := range re.FindAllStringSubmatch(comment, -1) {
			if !published[m[1]] {
				t.Errorf("docker-compose.yml:%d: the comment points at %s, a port no service publishes on the host", i+1, m[0])
			}
		}
	}
}

// TestDockerfileExposedPorts: every port a stage EXPOSEs is one its default command listens on
// beyond the loopback (serve's --listen or FACILITATOR_LISTEN; dev's --listen, and anvil's
// --anvil-port when --anvil-host lets it answer from outside), and each command-line flag is one
// the stage's binary defines.
func TestDockerfileExposedPorts(t *testing.T) {
	type stage struct {
		name       string
		entrypoint string
		cmd        []string
		expose     []string
		env        map[string]string
	}
	var stages []*stage
	for _, in := range dockerfileInstructions(t) {
		rest := strings.Join(in[1:], " ")
		switch strings.ToUpper(in[0]) {
		case "FROM":
			st := &stage{env: map[string]string{}}
			if len(in) >= 4 && strings.EqualFold(in[len(in)-2], "AS") {
				st.name = in[len(in)-1]
			}
			stages = append(stages, st)
		case "ENTRYPOINT":
			stages[len(stages)-1].entrypoint = rest
		case "CMD":
			var cmd []string
			if err := json.Unmarshal([]byte(rest), &cmd); err != nil {
				t.Errorf("Dockerfile: CMD %s is not a JSON list (the exec form): %v", rest, err)
			}
			stages[len(stages)-1].cmd = cmd
		case "EXPOSE":
			stages[len(stages)-1].expose = append(stages[len(stages)-1].expose, in[1:]...)
		case "ENV":
			for _, a := range in[1:] {
				if k, v, ok := strings.Cut(a, "="); ok {
					stages[len(stages)-1].env[k] = v
				}
			}
		}
	}
	reachable := func(addr string) (string, bool) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return "", false
		}
		ip := net.ParseIP(host)
		return port, host != "localhost" && (ip == nil || !ip.IsLoopback())
	}
	for _, st := range stages {
		if len(st.expose) == 0 {
			continue
		}
		dir := "cmd/facilitator"
		if strings.Contains(st.entrypoint, "facilitator-dev") {
			dir = "cmd/facilitator-dev"
		}
		src := commandSource(t, dir)
		for _, a := range st.cmd {
			if name, ok := strings.CutPrefix(a, "--"); ok {
				name, _, _ = strings.Cut(name, "=")
				if !definesFlag(src, name) && !strings.Contains(src, `"`+name+`"`) {
					t.Errorf("Dockerfile: stage %s: CMD flag --%s is not defined in %s", st.name, name, dir)
				}
			}
		}
		listening := map[string]bool{}
		listen, ok := flagValue(st.cmd, "listen")
		if !ok {
			listen = st.env["FACILITATOR_LISTEN"]
		}
		if port, ok := reachable(listen); ok {
			listening[port] = true
		}
		if dir == "cmd/facilitator-dev" {
			port, ok := flagValue(st.cmd, "anvil-port")
			if !ok {
				port = "8545"
			}
			host, _ := flagValue(st.cmd, "anvil-host")
			if _, ok := reachable(net.JoinHostPort(host, port)); ok && host != "" {
				listening[port] = true
			}
		}
		for _, p := range st.expose {
			p, _, _ = strings.Cut(p, "/")
			if !listening[p] {
				t.Errorf("Dockerfile: stage %s EXPOSEs %s, but its CMD %q listens there only on the loopback, or not at all", st.name, p, st.cmd)
			}
		}
	}
}

// TestDockerfileInstallScripts: the dev stage's npm ci runs no install script, and the
// Dockerfile names each package that --omit=dev installs and that has one, so its comment on
// why skipping them is safe stays true when the lockfile changes.
func TestDockerfileInstallScripts(t *testing.T) {
	var lock struct {
		Packages map[string]struct {
			Dev              bool `json:"dev"`
			HasInstallScript bool `json:"hasInstallScript"`
		} `json:"packages"`
	}
	if err := json.Unmarshal([]byte(readRepoFile(t, "package-lock.json")), &lock); err != nil {
		t.Fatal(err)
	}
	df := readRepoFile(t, "Dockerfile")
	for _, in := range dockerfileInstructions(t) {
		if line := strings.Join(in, " "); strings.Contains(line, "npm ci") && !strings.Contains(line, "--ignore-scripts") {
			t.Errorf("Dockerfile: %q runs the packages' install scripts", line)
		}
	}
	for p, pkg := range lock.Packages {
		// "dev" alone is omitted by --omit=dev; devOptional is installed (it is also an
		// optional dependency of a production package), as are the rest.
		if !pkg.HasInstallScript || pkg.Dev {
			continue
		}
		name := p[strings.LastIndex(p, "node_modules/")+len("node_modules/"):]
		if !strings.Contains(df, name) {
			t.Errorf("Dockerfile: npm ci --omit=dev installs %s, which has an install script; say in the dev stage's comment why skipping it is safe", name)
		}
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

// dockerStages are the Dockerfile's stage names, in order.
func dockerStages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, in := range dockerfileInstructions(t) {
		if strings.EqualFold(in[0], "FROM") && len(in) >= 4 && strings.EqualFold(in[len(in)-2], "AS") {
			out = append(out, in[len(in)-1])
		}
	}
	return out
}

// dockerStage is one FROM ... and what follows it, up to the next FROM.
type dockerStage struct {
	name, image                          string
	runs, copies, healthcheck            []string
	entrypoint, user                     string
	env                                  []string
	copiesPkg, copiesLock, npmCI, builds bool
}

// TestDockerfile: the default target (the last stage) is the serve image, the production binary
// alone with a HEALTHCHECK the binary answers itself; the dev stage carries node_modules for the
// local stack; both run as a non-root user.
func TestDockerfile(t *testing.T) {
	var stages []*dockerStage
	named := map[string]bool{}
	for _, in := range dockerfileInstructions(t) {
		args := in[1:]
		if strings.ToUpper(in[0]) == "FROM" {
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				args = args[1:]
			}
			if len(args) == 0 {
				t.Errorf("FROM without an image: %q", in)
				continue
			}
			if !named[args[0]] && !imagePinned(args[0]) {
				t.Errorf("FROM %s: not a tagged image (latest does not count)", args[0])
			}
			st := &dockerStage{image: args[0]}
			if len(args) == 3 && strings.EqualFold(args[1], "AS") {
				st.name = args[2]
				named[st.name] = true
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			continue // ARG before the first FROM
		}
		st := stages[len(stages)-1]
		line := strings.Join(args, " ")
		switch strings.ToUpper(in[0]) {
		case "RUN":
			st.runs = append(st.runs, line)
			if strings.Contains(line, "go build") && slices.Contains(args, "./cmd/facilitator") {
				st.builds = true
			}
			st.npmCI = st.npmCI || strings.Contains(line, "npm ci")
		case "COPY":
			for _, a := range args {
				if from, ok := strings.CutPrefix(a, "--from="); ok && !named[from] {
					t.Errorf("COPY --from=%s: no earlier stage has that name", from)
				}
			}
			st.copies = append(st.copies, line)
			st.copiesPkg = st.copiesPkg || slices.Contains(args, "package.json")
			st.copiesLock = st.copiesLock || slices.Contains(args, "package-lock.json")
		case "ENTRYPOINT":
			st.entrypoint = line
		case "USER":
			st.user = line
		case "HEALTHCHECK":
			st.healthcheck = args
		case "ENV":
			for _, a := range args {
				if k, _, ok := strings.Cut(a, "="); ok {
					st.env = append(st.env, k)
				}
			}
		}
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stage(s); want a build stage, the dev image and the serve image", len(stages))
	}
	if !slices.ContainsFunc(stages, func(s *dockerStage) bool { return s.builds }) {
		t.Error("Dockerfile: no RUN go build ... ./cmd/facilitator")
	}
	nonRoot := func(st *dockerStage) {
		if u := st.user; u == "" || u == "root" || u == "0" || strings.HasPrefix(u, "0:") {
			t.Errorf("Dockerfile: stage %s runs as %q; the image should run as a non-root user", st.name, u)
		}
	}

	// The dev image: node_modules from the lockfile, and both binaries.
	i := slices.IndexFunc(stages, func(s *dockerStage) bool { return s.name == "dev" })
	if i < 0 {
		t.Fatal("Dockerfile: no stage named dev (docker-compose.yml's local stack builds it)")
	}
	dev := stages[i]
	if !dev.copiesPkg || !dev.copiesLock {
		t.Error("Dockerfile: the dev stage must copy package.json and package-lock.json (facilitator-dev dev needs node_modules)")
	}
	if !dev.npmCI {
		t.Error("Dockerfile: the dev stage has no npm ci (the lockfile's pinned versions)")
	}
	if !strings.Contains(dev.entrypoint, "/usr/local/bin/facilitator-dev") {
		t.Errorf("Dockerfile: the dev stage's ENTRYPOINT %q does not run /usr/local/bin/facilitator-dev", dev.entrypoint)
	}
	nonRoot(dev)

	// The serve image, the default target: the production binary and nothing to run beside it.
	serve := stages[len(stages)-1]
	if serve == dev {
		t.Fatal("Dockerfile: the last stage (the default target) is the dev image; it should be the serve image")
	}
	if strings.Contains(serve.image, "node") {
		t.Errorf("Dockerfile: the serve image is based on %s; it should carry no Node", serve.image)
	}
	if len(serve.runs) > 0 || serve.npmCI || serve.copiesPkg {
		t.Errorf("Dockerfile: the serve stage runs %q; it should only copy the binary in", serve.runs)
	}
	for _, c := range serve.copies {
		if strings.Contains(c, "facilitator-dev") || strings.Contains(c, "node_modules") || strings.Contains(c, "anvil") {
			t.Errorf("Dockerfile: the serve stage copies %q, a dev tool", c)
		}
	}
	if !strings.Contains(serve.entrypoint, "/usr/local/bin/facilitator") || strings.Contains(serve.entrypoint, "facilitator-dev") {
		t.Errorf("Dockerfile: the serve stage's ENTRYPOINT %q does not run /usr/local/bin/facilitator", serve.entrypoint)
	}
	hc := strings.Join(serve.healthcheck, " ")
	if !strings.Contains(hc, "CMD") || !strings.Contains(hc, "/usr/local/bin/facilitator") {
		t.Errorf("Dockerfile: the serve stage's HEALTHCHECK is %q; want the binary's own probe", hc)
	} else if !slices.ContainsFunc(subcommands(t, "cmd/facilitator"), func(c string) bool { return strings.Contains(hc, `"`+c+`"`) }) {
		t.Errorf("Dockerfile: the HEALTHCHECK %q runs no subcommand cmd/facilitator/main.go handles", hc)
	}
	nonRoot(serve)
	src := facilitatorSource(t)
	for _, k := range serve.env {
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
		"cmd/facilitator/main.go", "cmd/facilitator-dev/main.go", "migrations/0001_networks.up.sql",
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
