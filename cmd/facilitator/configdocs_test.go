package main

import (
	"flag"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestConfigurationDocs holds docs/configuration.md's flag table to serve's flag set: every flag
// has a row, every row names flags that exist, the environment variable each row names is the one
// the flag reads, and a default shown in code quotes is the flag's default.
func TestConfigurationDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := serveFlags(func(string) string { return "" })
	holdFlagTable(t, fs, flagTable(t, string(doc), "Flags and environment"), "serve")
}

// TestCommandFlagsDocumented holds the flag tables of the operator's other commands, under
// "Operator commands" in docs/configuration.md, to their flag sets the same way.
func TestCommandFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) string { return "" }
	statusFS, _, _ := statusFlags(none)
	for heading, fs := range map[string]*flag.FlagSet{
		"facilitator status":            statusFS,
		"facilitator migrate":           migrateFlags(none),
		"facilitator settlements stuck": func() *flag.FlagSet { fs, _ := stuckFlags(none); return fs }(),
	} {
		t.Run(heading, func(t *testing.T) { holdFlagTable(t, fs, flagTable(t, string(doc), heading), heading) })
	}
}

// flagTable reads the flag rows under a heading of the page (up to the next heading of the same
// or a higher level): flag -> env, default, as the table shows them.
func flagTable(t *testing.T, doc, heading string) map[string][3]string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	start := slices.IndexFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "#") && strings.TrimSpace(strings.TrimLeft(l, "#")) == heading
	})
	if start < 0 {
		t.Fatalf("docs/configuration.md has no heading %q", heading)
	}
	level := len(lines[start]) - len(strings.TrimLeft(lines[start], "#"))
	rows := map[string][3]string{}
	quoted := regexp.MustCompile("`([^`]*)`")
	for _, line := range lines[start+1:] {
		if l := len(line) - len(strings.TrimLeft(line, "#")); l > 0 && l <= level {
			break
		}
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.Split(line, "|")[1:]
		if len(cells) < 4 {
			t.Errorf("a flag row without its four cells: %s", line)
			continue
		}
		flags := quoted.FindAllStringSubmatch(cells[0], -1)
		envs := quoted.FindAllStringSubmatch(cells[1], -1)
		defs := quoted.FindAllStringSubmatch(cells[2], -1)
		for i, f := range flags {
			var row [3]string
			if i < len(envs) {
				row[0] = envs[i][1]
			}
			if i < len(defs) {
				row[1] = defs[i][1]
			}
			rows[strings.TrimPrefix(f[1], "--")] = row
		}
	}
	return rows
}

// holdFlagTable checks rows against fs both ways: every flag has a row, every row names a flag,
// the environment variable a row names is the one the flag reads, and a default shown in code
// quotes is the flag's default.
func holdFlagTable(t *testing.T, fs *flag.FlagSet, rows map[string][3]string, what string) {
	t.Helper()
	fs.VisitAll(func(f *flag.Flag) {
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("%s --%s has no row in docs/configuration.md", what, f.Name)
			return
		}
		delete(rows, f.Name)
		if row[0] != "" && !regexp.MustCompile(`\(`+row[0]+`[);]`).MatchString(f.Usage) {
			t.Errorf("%s --%s: the docs name %s, the flag reads %q", what, f.Name, row[0], f.Usage)
		}
		if row[1] != "" && row[1] != f.DefValue {
			t.Errorf("%s --%s: the docs say the default is %q, the flag's is %q", what, f.Name, row[1], f.DefValue)
		}
	})
	for name := range rows {
		t.Errorf("docs/configuration.md has a row for %s --%s, which it does not have", what, name)
	}
}

// TestNetworkFieldsDocumented holds the field tables of a networks entry to the structs the JSON
// is read into, both ways: every JSON field has a row, and every field a row names is read (unknown
// keys are refused at start, so a documented field that does not exist is a configuration that
// cannot start).
func TestNetworkFieldsDocumented(t *testing.T) {
	for _, tc := range []struct {
		typ           reflect.Type
		page, heading string
	}{
		{reflect.TypeFor[NetworkConfig](), "configuration.md", "Network entry fields"},
		{reflect.TypeFor[TokenConfig](), "configuration.md", "Token entry fields"},
		{reflect.TypeFor[FeesConfig](), "configuration.md", "Fees"},
		{reflect.TypeFor[BatchConfig](), "settlement.md", "Batched settlement"},
	} {
		t.Run(tc.typ.Name(), func(t *testing.T) {
			documented := fieldTable(t, "../../docs/"+tc.page, tc.heading)
			for _, f := range reflect.VisibleFields(tc.typ) {
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if !f.IsExported() || name == "-" {
					continue
				}
				if name == "" {
					name = f.Name
				}
				if !documented[name] {
					t.Errorf("%s has the JSON field %q; the table under %q in docs/%s lacks it", tc.typ.Name(), name, tc.heading, tc.page)
				}
				delete(documented, name)
			}
			for name := range documented {
				t.Errorf("docs/%s (%q) documents %q; %s has no such JSON field", tc.page, tc.heading, name, tc.typ.Name())
			}
		})
	}
}

// fieldTable is the set of names in the first column of the first table under a page's heading
// whose header starts with "field": every code span of the cell (a row may document two fields).
func fieldTable(t *testing.T, path, heading string) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(text), "\n")
	start := slices.IndexFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "#") && strings.TrimSpace(strings.TrimLeft(l, "#")) == heading
	})
	if start < 0 {
		t.Fatalf("%s has no heading %q", path, heading)
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	out := map[string]bool{}
	in := false
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l, "#") || in && !strings.HasPrefix(l, "|") {
			break
		}
		if !strings.HasPrefix(l, "|") {
			continue
		}
		first := strings.TrimSpace(strings.Split(l, "|")[1])
		switch {
		case !in:
			in = first == "field"
		case strings.Trim(first, "- ") != "": // not the header's rule
			for _, m := range quoted.FindAllStringSubmatch(first, -1) {
				out[m[1]] = true
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no field table under %q", path, heading)
	}
	return out
}
