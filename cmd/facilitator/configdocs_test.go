package main

import (
	"flag"
	"os"
	"regexp"
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
	rows := map[string][3]string{} // flag -> env, default, as the table shows them
	quoted := regexp.MustCompile("`([^`]*)`")
	for _, line := range strings.Split(string(doc), "\n") {
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
	fs.VisitAll(func(f *flag.Flag) {
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("--%s has no row in docs/configuration.md", f.Name)
			return
		}
		delete(rows, f.Name)
		if row[0] != "" && !regexp.MustCompile(`\(`+row[0]+`[);]`).MatchString(f.Usage) {
			t.Errorf("--%s: the docs name %s, the flag reads %q", f.Name, row[0], f.Usage)
		}
		if row[1] != "" && row[1] != f.DefValue {
			t.Errorf("--%s: the docs say the default is %q, the flag's is %q", f.Name, row[1], f.DefValue)
		}
	})
	for name := range rows {
		t.Errorf("docs/configuration.md has a row for --%s, which serve does not have", name)
	}
}
