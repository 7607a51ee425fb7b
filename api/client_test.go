package api_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
)

// TestClientAddressBehindProxy: the per-client rate limit and the access log key on the forwarded
// client only when the TCP peer is a trusted proxy; a header from any other peer changes nothing.
func TestClientAddressBehindProxy(t *testing.T) {
	var logs bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	srv := api.New(api.Config{Verifier: &stubVerifier{}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Auth:           &api.AuthConfig{Mode: api.AuthOpen, PerClient: auth.Limit{Rate: 0.001, Burst: 1}, Now: func() time.Time { return now }}})
	body := newPayment(t, 1).body(t)
	verify := func(peer, forwardedFor string) int {
		req := httptest.NewRequest(http.MethodPost, "/verify", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.RemoteAddr = peer
		if forwardedFor != "" {
			req.Header.Set("X-Forwarded-For", forwardedFor)
		}
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	for _, c := range []struct {
		name, peer, xff string
		want            int
	}{
		// Behind the proxy: each forwarded client has its own bucket of one.
		{"first client via the proxy", "10.0.0.1:4000", "203.0.113.1", 200},
		{"second client via the proxy", "10.0.0.1:4001", "1.2.3.4, 203.0.113.2", 200},
		{"first client again", "10.0.0.2:4002", "203.0.113.1", 429},
		// Not a proxy: the header is the client's own word, and ignored.
		{"untrusted peer", "198.51.100.1:5000", "203.0.113.3", 200},
		{"untrusted peer, another header", "198.51.100.1:5001", "203.0.113.4", 429},
		{"untrusted peer posing as the proxy's client", "198.51.100.2:5002", "203.0.113.5, 10.0.0.1", 200},
	} {
		if got := verify(c.peer, c.xff); got != c.want {
			t.Errorf("%s (%s, X-Forwarded-For %q): %d, want %d", c.name, c.peer, c.xff, got, c.want)
		}
	}
	for _, want := range []string{"client=203.0.113.1", "client=203.0.113.2", "client=198.51.100.1", "client=198.51.100.2"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the access log lacks %s:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "client=203.0.113.4") || strings.Contains(logs.String(), "client=203.0.113.5") {
		t.Errorf("the access log believed an untrusted peer's header:\n%s", logs.String())
	}
}
