package docs

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The API page is held against the OpenAPI document (which api's own tests hold against the
// routes), both ways. The configuration page's tables are held against the code in
// cmd/facilitator (configdocs_test.go), where the types are.

// endpointRef is an endpoint as the API page writes it: `METHOD /path`.
var endpointRef = regexp.MustCompile("`(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|TRACE) (/[^`\\s]*)`")

// TestAPIPageMatchesOpenAPI: every operation of api/openapi.json is on docs/api.md, and every
// `METHOD /path` the page names is an operation of the document.
func TestAPIPageMatchesOpenAPI(t *testing.T) {
	raw, err := os.ReadFile("../api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	spec := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if m := strings.ToUpper(method); slices.Contains([]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}, m) {
				spec[m+" "+path] = true
			}
		}
	}
	if len(spec) == 0 {
		t.Fatal("no operations in api/openapi.json")
	}
	page, err := os.ReadFile("api.md")
	if err != nil {
		t.Fatal(err)
	}
	onPage := map[string]bool{}
	for _, m := range endpointRef.FindAllStringSubmatch(string(page), -1) {
		path, _, _ := strings.Cut(m[2], "?")
		onPage[m[1]+" "+path] = true
	}
	for _, op := range missing(spec, onPage) {
		t.Errorf("api/openapi.json has %s; docs/api.md does not name it", op)
	}
	for _, op := range missing(onPage, spec) {
		t.Errorf("docs/api.md names %s; api/openapi.json has no such operation", op)
	}
}

// missing is what of want is not in have, sorted.
func missing(want, have map[string]bool) []string {
	var out []string
	for k := range want {
		if !have[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
