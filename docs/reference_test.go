package docs

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The reference pages are held against what they describe, both ways: the API page against the
// OpenAPI document (which api's own tests hold against the routes), and the configuration page's
// field tables against the Go structs the networks JSON is read into.

var (
	// endpointRef is an endpoint as the API page writes it: `METHOD /path`.
	endpointRef = regexp.MustCompile("`(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|TRACE) (/[^`\\s]*)`")
	codeSpan    = regexp.MustCompile("`([^`]+)`")
)

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

// TestNetworkFieldsDocumented: every JSON field of a networks entry (cmd/facilitator's
// NetworkConfig and the structs under it) is in its table on the configuration or settlement page,
// and every field a table names is one the struct reads (unknown keys are refused at start, so a
// documented field that does not exist is a configuration that cannot start).
func TestNetworkFieldsDocumented(t *testing.T) {
	for _, tc := range []struct {
		file, typ, page, heading string
	}{
		{"../cmd/facilitator/config.go", "NetworkConfig", "configuration.md", "Network entry fields"},
		{"../cmd/facilitator/config.go", "TokenConfig", "configuration.md", "Token entry fields"},
		{"../cmd/facilitator/fees.go", "FeesConfig", "configuration.md", "Fees"},
		{"../cmd/facilitator/batch.go", "BatchConfig", "settlement.md", "Batched settlement"},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			code := jsonFields(t, tc.file, tc.typ)
			doc := fieldTable(t, tc.page, tc.heading)
			for _, f := range missing(code, doc) {
				t.Errorf("%s has the JSON field %q; the table under %q in docs/%s lacks it", tc.typ, f, tc.heading, tc.page)
			}
			for _, f := range missing(doc, code) {
				t.Errorf("docs/%s (%q) documents %q; %s has no such JSON field", tc.page, tc.heading, f, tc.typ)
			}
		})
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

// jsonFields are the JSON names of a struct type's exported fields, read from its source (the
// type lives in package main, which a test cannot import).
func jsonFields(t *testing.T, file, typ string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var st *ast.StructType
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == typ {
			st, _ = ts.Type.(*ast.StructType)
		}
		return st == nil
	})
	if st == nil {
		t.Fatalf("no struct %s in %s", typ, file)
	}
	out := map[string]bool{}
	for _, field := range st.Fields.List {
		if len(field.Names) == 0 || !field.Names[0].IsExported() {
			continue
		}
		name := field.Names[0].Name
		if field.Tag != nil {
			tag, err := strconv.Unquote(field.Tag.Value)
			if err != nil {
				t.Fatal(err)
			}
			if j, ok := reflect.StructTag(tag).Lookup("json"); ok {
				if j, _, _ = strings.Cut(j, ","); j == "-" {
					continue
				} else if j != "" {
					name = j
				}
			}
		}
		out[name] = true
	}
	if len(out) == 0 {
		t.Fatalf("%s has no JSON fields", typ)
	}
	return out
}

// fieldTable is the set of names in the first column of the first table under a page's heading
// whose header starts with "field": every code span of the cell (a row may document two fields).
func fieldTable(t *testing.T, page, heading string) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(text), "\n")
	start := slices.IndexFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "#") && strings.TrimSpace(strings.TrimLeft(l, "#")) == heading
	})
	if start < 0 {
		t.Fatalf("docs/%s has no heading %q", page, heading)
	}
	out := map[string]bool{}
	in := false
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l, "#") {
			break
		}
		if !strings.HasPrefix(l, "|") {
			if in {
				break
			}
			continue
		}
		cells := strings.Split(l, "|")
		first := strings.TrimSpace(cells[1])
		switch {
		case !in && first == "field":
			in = true
		case in && strings.Trim(first, "- ") == "":
			// the header's rule
		case in:
			for _, m := range codeSpan.FindAllStringSubmatch(first, -1) {
				out[m[1]] = true
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("docs/%s has no field table under %q", page, heading)
	}
	return out
}
