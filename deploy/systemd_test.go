package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	unitFile       = "deploy/systemd/facilitator.service"
	envFileExample = "deploy/systemd/facilitator.env.example"
	unitBinary     = "/usr/local/bin/facilitator"
)

// unit is a systemd unit file: section, then key, then every value given (LoadCredential,
// Environment and ExecStartPre may repeat).
type unit map[string]map[string][]string

func (u unit) last(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func parseUnit(t *testing.T, text string) unit {
	t.Helper()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		case strings.HasSuffix(line, `\`):
			t.Fatalf("%s:%d: continued lines are beyond this parser; keep each setting on one line", unitFile, n)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q is not key=value inside a section", unitFile, n, line)
			}
			u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u
}

// parseEnvFile reads KEY=VALUE lines as systemd's EnvironmentFile= does (no export, no quotes
// needed).
func parseEnvFile(t *testing.T, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(k, "export ") {
			t.Errorf("%s:%d: %q is not KEY=VALUE", envFileExample, i+1, line)
			continue
		}
		out[k] = v
	}
	return out
}

// TestSystemdUnit: the unit runs serve from the production binary with documented flags, keeps
// migrations a step of their own, stops with time to drain, hands the signer keys over as a
// credential (mode 0400, which serve accepts) and runs hardened.
func TestSystemdUnit(t *testing.T) {
	u := parseUnit(t, readRepoFile(t, unitFile))
	cfg := readDocumentedConfig(t)
	commands := subcommands(t, "cmd/facilitator")
	svc := u["Service"]
	if svc == nil {
		t.Fatal("no [Service] section")
	}
	if _, ok := u["Install"]["WantedBy"]; !ok {
		t.Error("no [Install] WantedBy: systemctl enable would do nothing")
	}

	// args are a command line of the production binary: a subcommand it handles, documented flags.
	args := func(key, line string) []string {
		f := strings.Fields(strings.TrimLeft(line, "-@:+!"))
		if len(f) < 2 || f[0] != unitBinary {
			t.Errorf("%s=%s: want %s <command>", key, line, unitBinary)
			return nil
		}
		if !slices.Contains(commands, f[1]) {
			t.Errorf("%s=%s: cmd/facilitator/main.go handles no %q", key, line, f[1])
		}
		for _, a := range f[2:] {
			if name, ok := strings.CutPrefix(a, "--"); ok {
				name, _, _ = strings.Cut(name, "=")
				if !cfg.flags[name] {
					t.Errorf("%s: flag --%s is not in docs/configuration.md", key, name)
				}
			}
		}
		return f[1:]
	}
	starts := svc["ExecStart"]
	if len(starts) != 1 {
		t.Fatalf("want one ExecStart, got %q", starts)
	}
	serve := args("ExecStart", starts[0])
	if len(serve) == 0 || serve[0] != "serve" {
		t.Fatalf("ExecStart runs %q, want serve", serve)
	}

	// Migrations run before serve, as facilitator migrate; then serve need not migrate too.
	migrates := false
	for _, pre := range svc["ExecStartPre"] {
		if a := args("ExecStartPre", pre); len(a) > 0 && a[0] == "migrate" {
			migrates = true
		}
	}
	if !migrates {
		t.Error("no ExecStartPre=" + unitBinary + " migrate")
	} else if v, _ := flagValue(serve, "migrate"); v != "false" {
		t.Error("ExecStartPre migrates, so serve should not: give it --migrate=false")
	}

	// The keys come as a credential: %d/<name> is a file LoadCredential names.
	creds := map[string]string{}
	for _, lc := range svc["LoadCredential"] {
		name, src, _ := strings.Cut(lc, ":")
		creds[name] = src
	}
	keys, ok := flagValue(serve, "signer-keys-file")
	if !ok {
		t.Fatal("serve has no --signer-keys-file: the keys should come from a LoadCredential file")
	}
	name, ok := strings.CutPrefix(keys, "%d/")
	if !ok {
		t.Errorf("--signer-keys-file %s is not in the credentials directory (%%d/<name>)", keys)
	} else if src := creds[name]; src == "" || !filepath.IsAbs(src) {
		t.Errorf("--signer-keys-file %s: no LoadCredential=%s:<absolute path>", keys, name)
	}
	if nf, ok := flagValue(serve, "networks-file"); ok {
		if name, ok := strings.CutPrefix(nf, "%d/"); ok && creds[name] == "" {
			t.Errorf("--networks-file %s: no LoadCredential=%s:<path>", nf, name)
		}
	}

	// Stopping: SIGTERM drains, within the stop timeout.
	if s := u.last("Service", "KillSignal"); s != "" && s != "SIGTERM" && s != "SIGINT" {
		t.Errorf("KillSignal=%s: serve drains on SIGTERM or SIGINT", s)
	}
	stop, ok := systemdDuration(u.last("Service", "TimeoutStopSec"))
	if !ok || stop < minDrain {
		t.Errorf("TimeoutStopSec=%q: want at least %s for serve's drain", u.last("Service", "TimeoutStopSec"), minDrain)
	}
	if r := u.last("Service", "Restart"); r != "on-failure" && r != "always" && r != "on-abnormal" {
		t.Errorf("Restart=%q: want on-failure (or always)", r)
	}

	// Hardening.
	user := u.last("Service", "User")
	if u.last("Service", "DynamicUser") != "yes" && (user == "" || user == "root" || user == "0") {
		t.Error("want DynamicUser=yes or a dedicated User=")
	}
	for k, want := range map[string]string{
		"ProtectSystem":   "strict",
		"NoNewPrivileges": "yes",
		"PrivateTmp":      "yes",
		"ProtectHome":     "yes",
		"PrivateDevices":  "yes",
	} {
		if got := u.last("Service", k); got != want {
			t.Errorf("%s=%q, want %s", k, got, want)
		}
	}
	if caps, ok := svc["CapabilityBoundingSet"]; !ok || caps[len(caps)-1] != "" {
		t.Errorf("CapabilityBoundingSet=%q: serve needs no capability (empty drops them all)", caps)
	}

	// The environment file: documented variables only, and no keys in it.
	envFile := u.last("Service", "EnvironmentFile")
	if strings.TrimPrefix(envFile, "-") == "" {
		t.Error("no EnvironmentFile= (DATABASE_URL and the settings)")
	}
	env := parseEnvFile(t, readRepoFile(t, envFileExample))
	for k := range env {
		if !cfg.env[k] {
			t.Errorf("%s: %s is not in docs/configuration.md's table", envFileExample, k)
		}
	}
	if _, ok := env["DATABASE_URL"]; !ok {
		t.Errorf("%s: no DATABASE_URL (serve and migrate need it)", envFileExample)
	}
	if _, ok := env["FACILITATOR_SIGNER_KEYS"]; ok {
		t.Errorf("%s: FACILITATOR_SIGNER_KEYS puts the keys in the environment; the unit hands them over as a credential", envFileExample)
	}
	if strings.Contains(envFile, "/") && !strings.Contains(readRepoFile(t, envFileExample), strings.TrimPrefix(envFile, "-")) {
		t.Errorf("%s does not say it is installed as %s", envFileExample, envFile)
	}
}

// systemdDuration reads a systemd time span ("90", "90s", "1min 30s", "infinity"); the zero
// value and false when it is none.
func systemdDuration(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if s == "infinity" {
		return time.Duration(1<<63 - 1), true
	}
	units := map[string]time.Duration{"": time.Second, "us": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "sec": time.Second, "m": time.Minute, "min": time.Minute,
		"h": time.Hour, "hr": time.Hour, "d": 24 * time.Hour}
	re := regexp.MustCompile(`^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)`)
	var total time.Duration
	for s != "" {
		m := re.FindStringSubmatch(s)
		if m == nil {
			return 0, false
		}
		unit, ok := units[m[2]]
		if !ok {
			return 0, false
		}
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, false
		}
		total += time.Duration(f * float64(unit))
		s = strings.TrimSpace(s[len(m[0]):])
	}
	return total, total > 0
}

// TestSystemdAnalyzeVerify runs systemd's own check of the unit, which knows every directive
// (a misspelt key is only a warning to systemd, so any word about the unit fails the test). It
// checks that ExecStart's binary exists, so a copy names an executable that does.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is checked by TestSystemdUnit alone")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(readRepoFile(t, unitFile), unitBinary+" ", self+" ")
	dir := t.TempDir()
	path := filepath.Join(dir, filepath.Base(unitFile))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(sa, "verify", path)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	about := regexp.MustCompile(regexp.QuoteMeta(filepath.Base(unitFile)) + `\b`)
	var complaints []string
	for _, l := range strings.Split(out.String(), "\n") {
		if about.MatchString(l) {
			complaints = append(complaints, l)
		}
	}
	if runErr != nil || len(complaints) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitFile, runErr, out.String())
	}
}
