package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/ops"
)

// countingOps is an operations overview that counts who read it: operator data served.
type countingOps struct{ reads atomic.Int64 }

func (o *countingOps) Overview(context.Context) ops.Snapshot {
	o.reads.Add(1)
	return ops.Snapshot{}
}

// accessStatus is the OpenAPI fakes' status service with the timeline the console reads.
type accessStatus struct{ *oasFakes }

func (accessStatus) Timeline(context.Context, facilitator.AuthorizationKey) ([]facilitator.SettlementEvent, error) {
	return nil, nil
}

// accessServer is every route New registers, on the OpenAPI test's fakes, behind keys mode, with
// the real console in front of an overview that counts its reads (the API's and the console's).
func accessServer(t testing.TB) (*Server, *countingOps) {
	f := oasDefaultFakes()
	d := notify.New(notify.Config{Store: &oasStore{f: f}, Status: f, StreamPoll: time.Hour, KeepAlive: time.Hour})
	t.Cleanup(d.Stop)
	overview := &countingOps{}
	authCfg := &AuthConfig{Mode: AuthKeys, Keys: oasKeyStore{f: f}}
	con, err := console.New(console.Config{Status: accessStatus{f}, HTTPStatus: HTTPStatus, Ops: overview,
		Sessions: ConsoleSessions(authCfg)})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Verifier: f, Settler: f, Status: f, Notify: oasNotify{f: f, d: d}, Lists: f, Console: con, Ops: overview,
		Logger: slog.New(slog.DiscardHandler), Auth: authCfg})
	return s, overview
}

// serveAccess answers one request for the raw request target (sent as is, like a client's
// request line), with key ("" for none). The context is already canceled, so an event stream
// ends after what it sends on opening.
func serveAccess(s *Server, method, target, key string) (code int, reason string) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, method, target, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, req)
	if strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		// A console page: the refusal is a page, and its reason the page's heading.
		return w.Code, "page"
	}
	var body struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	return w.Code, body.Error
}

// accessRoutes is every route New registers (echo's own list), as a method and a concrete path:
// each parameter a valid value, each wildcard the console's pages under it.
func accessRoutes(s *Server) [][2]string {
	params := map[string]string{":network": oasNetwork, ":asset": oasAsset, ":from": oasFrom, ":nonce": oasNonce,
		":id": oasPayID, ":tx": oasTx}
	wild := map[string][]string{
		"/console/*": {"/console/", "/console/authorizations/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/" + oasNonce,
			"/console/settlements/" + oasTx, "/console/payments/" + oasPayID, "/console/ops/overview.json"},
		"/console/static/*": {"/console/static/console.css"},
		"/console/ops/*":    {"/console/ops/overview.json"},
	}
	var out [][2]string
	for _, r := range s.echo.Routes() {
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodDelete:
		default:
			continue // echo's own entries
		}
		if paths, ok := wild[r.Path]; ok {
			for _, p := range paths {
				out = append(out, [2]string{r.Method, p})
			}
			continue
		}
		if strings.Contains(r.Path, "*") {
			panic("route " + r.Path + ": teach accessRoutes its pages")
		}
		segs := strings.Split(r.Path, "/")
		for i, seg := range segs {
			if v, ok := params[seg]; ok {
				segs[i] = v
			} else if strings.HasPrefix(seg, ":") {
				panic("route " + r.Path + ": teach accessRoutes a value for " + seg)
			}
		}
		out = append(out, [2]string{r.Method, strings.Join(segs, "/")})
	}
	return out
}

// isOperatorPath is what serves operator data, by what the handlers serve (not by the guard's
// decision, which is what is tested).
func isOperatorPath(p string) bool {
	return strings.HasPrefix(p, "/v1/ops/") || strings.HasPrefix(p, "/console/ops")
}

// spellings are other ways to write path: the ones that must be refused before routing (they
// are spelled differently encoded and decoded, or cleaned and not), and the ones that are
// canonical but spelled in other letters (the routers are case-sensitive, the guard is not).
func spellings(path string) (refused, otherCase []string) {
	segs := strings.Split(path[1:], "/")
	last := len(segs) - 1
	for last > 0 && segs[last] == "" {
		last--
	}
	with := func(i int, seg string) string {
		c := append([]string(nil), segs...)
		c[i] = seg
		return "/" + strings.Join(c, "/")
	}
	for i, seg := range segs {
		if seg == "" {
			continue
		}
		// A letter or digit percent-encoded, in lower and upper hex.
		refused = append(refused, with(i, fmt.Sprintf("%%%02x", seg[0])+seg[1:]), with(i, fmt.Sprintf("%%%02X", seg[0])+seg[1:]))
		// Doubled slashes, dot segments, an encoded slash, and dot segments encoded.
		refused = append(refused, with(i, "/"+seg), with(i, "./"+seg), with(i, "x/../"+seg), with(i, "%2e/"+seg), with(i, "x/%2E%2E/"+seg))
		if i > 0 {
			c := append(append(append([]string(nil), segs[:i-1]...), segs[i-1]+"%2F"+seg), segs[i+1:]...)
			refused = append(refused, "/"+strings.Join(c, "/"))
		}
		otherCase = append(otherCase, with(i, strings.ToUpper(seg[:1])+seg[1:]), with(i, strings.ToUpper(seg)))
	}
	refused = append(refused, "/."+path, "/console/static/.."+path, "/console/static/%2e%2e"+path)
	if len(segs) > 1 {
		refused = append(refused, "/"+strings.Join(segs, "//"))
	}
	return refused, otherCase
}

// openConsolePath is a console path anyone may open: its assets, login and logout.
func openConsolePath(p string) bool {
	return strings.HasPrefix(p, "/console/static/") || p == "/console/login" || p == "/console/logout"
}

// decision is what the guard decided, read off an answer: refused (401, 403), or let through.
func decision(code int) string {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Sprint(code)
	}
	return "through"
}

// TestAccessEverySpelling walks every route with every key (none, a merchant's with every scope
// but operator, an operator's) and every other spelling of its path: encoded, doubled slashes,
// dot segments, an encoded slash, mixed case. A spelling that decodes or cleans to another path
// is refused (400 non_canonical_path) before it is routed; one in other letters gets the same
// decision as the route itself. No spelling of an operator route answers a key without the
// operator scope with anything but a refusal, and operator data is never read for it.
func TestAccessEverySpelling(t *testing.T) {
	s, overview := accessServer(t)
	merchant, operator := oasKeyWithout[facilitator.ScopeOperator].full, oasKeyAll.full
	routes := accessRoutes(s)
	if len(routes) < 20 {
		t.Fatalf("only %d routes: %v", len(routes), routes)
	}
	for _, r := range routes {
		method, path := r[0], r[1]
		for _, key := range []string{"", merchant, operator} {
			want, _ := serveAccess(s, method, path, key)
			if isOperatorPath(path) && key != operator && want != http.StatusUnauthorized && want != http.StatusForbidden {
				t.Errorf("%s %s with key %.12s: %d, want 401 or 403", method, path, key, want)
			}
			refused, otherCase := spellings(path)
			for _, v := range refused {
				before := overview.reads.Load()
				code, reason := serveAccess(s, method, v, key)
				if code != http.StatusBadRequest || (reason != facilitator.ReasonNonCanonicalPath && reason != "page") {
					t.Errorf("%s %s (for %s) with key %.12s: %d %q, want 400 %s", method, v, path, key, code, reason, facilitator.ReasonNonCanonicalPath)
				}
				if key != operator && overview.reads.Load() != before {
					t.Errorf("%s %s with key %.12s read the operations overview", method, v, key)
				}
			}
			for _, v := range otherCase {
				before := overview.reads.Load()
				code, _ := serveAccess(s, method, v, key)
				if got, exp := decision(code), decision(want); got != exp && !openConsolePath(path) {
					// (An open page spelled in other letters is no longer open: its answer, the
					// login form's own 401 among them, is not the guard's.)
					t.Errorf("%s %s (for %s) with key %.12s: %d (%s), want the route's decision (%d, %s)", method, v, path, key, code, got, want, exp)
				}
				if key != operator && overview.reads.Load() != before {
					t.Errorf("%s %s with key %.12s read the operations overview", method, v, key)
				}
				if isOperatorPath(path) && key != operator && code < 400 {
					t.Errorf("%s %s with key %.12s: %d", method, v, key, code)
				}
			}
		}
	}
	if overview.reads.Load() == 0 {
		t.Fatal("the operator key never read the overview: the walk reached no operator handler")
	}
}

// FuzzAccessDecision: whatever the path, a key without the operator scope never gets operator
// data (no overview is read for it, by the API or the console), and whatever is not refused as
// non-canonical was decided on the path the handlers serve.
func FuzzAccessDecision(f *testing.F) {
	for _, p := range []string{"/console/ops", "/console/%6fps", "/console/%6Fps/overview.json", "/console//ops", "/console/./ops",
		"/console/x/../ops", "/console/static/../ops", "/console%2Fops", "/v1/ops/overview", "/v1/ops/%6fverview", "/v1//ops/overview",
		"/CONSOLE/OPS", "/console/Ops/overview.json", "/console/ops/", "/console/%2e%2e/console/ops", "/console/static/%2e%2e/ops",
		"/console/ops/overview.json?x=1", "/console/ops%2Foverview.json", "/console/ops/%2E/overview.json"} {
		f.Add(p)
	}
	s, overview := accessServer(f)
	merchant := oasKeyWithout[facilitator.ScopeOperator].full
	f.Fuzz(func(t *testing.T, target string) {
		if !strings.HasPrefix(target, "/") {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: facilitator.test\r\nAuthorization: Bearer " + merchant + "\r\n\r\n")))
		if err != nil {
			return // not a request line the server would take
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		before := overview.reads.Load()
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req.WithContext(ctx))
		if overview.reads.Load() != before {
			t.Fatalf("GET %q with a merchant key read the operations overview: %d %.200s", target, w.Code, w.Body)
		}
		if isOperatorPath(strings.ToLower(req.URL.Path)) && w.Code < 400 {
			t.Fatalf("GET %q (%q) with a merchant key: %d", target, req.URL.Path, w.Code)
		}
	})
}
