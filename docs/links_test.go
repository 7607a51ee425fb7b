// Package docs holds the project's documentation pages; its test keeps their links true.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pages are the documents a reader follows links between, from the module root.
var pages = []string{"../README.md", "../ARCHITECTURE.md", "../BENCHMARKS.md", "../deploy/README.md"}

var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#+ (.+)$`)
)

// anchor is the id GitHub's renderer gives a heading.
func anchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLinks: every relative link of every page names a file of the repository, and a link's
// #fragment a heading of its page; every page in docs/ is linked from the README.
func TestLinks(t *testing.T) {
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if !strings.Contains(string(readme), "(docs/"+d+")") {
			t.Errorf("docs/%s is not linked from the README", d)
		}
	}
	for _, page := range append(pages, docs...) {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", page, target)
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, h := range heading.FindAllStringSubmatch(string(body), -1) {
				if anchor(h[1]) == frag {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s links to %s: no such heading in %s", page, target, path)
			}
		}
	}
}
