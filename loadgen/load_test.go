package loadgen

import (
	"crypto/ecdsa"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// verifyCounter is a /verify that finds every payment valid and counts the bodies it was sent.
type verifyCounter struct {
	mu     sync.Mutex
	bodies map[string]int
	total  int
}

func (v *verifyCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.URL.Path != "/verify" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	v.mu.Lock()
	v.bodies[string(body)]++
	v.total++
	v.mu.Unlock()
	_ = json.NewEncoder(w).Encode(facilitator.VerifyResponse{IsValid: true})
}

// TestVerifyLoadDistinct: at a fixed arrival rate and in a closed loop alike, the /verify load sends
// every payment it signed once and no body twice, so that no verdict can come from a cache that a
// merchant's traffic (every payment new) would not hit.
func TestVerifyLoadDistinct(t *testing.T) {
	tok := newToken(common.HexToAddress("0x01"), "USD Coin", "2", 31337)
	var payers []*ecdsa.PrivateKey
	for range 3 {
		k, err := crypto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		payers = append(payers, k)
	}
	for _, tc := range []struct {
		name    string
		offered float64
		c, n    int
	}{
		{"closed loop", 0, 8, 300},
		{"fixed rate", 5000, 4, 200},
		{"one caller", 0, 1, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pays, err := signPayments(tok, payers, tc.n, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			srv := &verifyCounter{bodies: map[string]int{}}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			// The phase ends when the payments are used up, long before its duration.
			v := runVerify(t.Context(), &poster{base: ts.URL, hc: ts.Client()}, pays, tc.offered, tc.c, time.Hour)
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if v.Requests != tc.n || v.Sent != tc.n || v.Failed != 0 || v.Payments != tc.n {
				t.Fatalf("requests %d, sent %d, failed %d (%s), signed %d; want %d sent and valid", v.Requests, v.Sent, v.Failed, v.FirstFailed, v.Payments, tc.n)
			}
			if srv.total != tc.n || len(srv.bodies) != tc.n {
				t.Fatalf("the server got %d requests with %d distinct bodies; want %d of each", srv.total, len(srv.bodies), tc.n)
			}
			for _, p := range pays {
				if got := srv.bodies[string(p.Body)]; got != 1 {
					t.Fatalf("a payment was verified %d times, want once", got)
				}
			}
			if v.Offered != tc.offered || len(v.Latencies) != tc.n {
				t.Fatalf("offered %v, %d latencies", v.Offered, len(v.Latencies))
			}
		})
	}
	// A phase that ends at its duration has sent some of its payments, each once: at 100/s for
	// 100 ms, requests are due at 0, 10, … 90 ms, so at most 10 start however slow the machine.
	t.Run("ends at its duration", func(t *testing.T) {
		pays, err := signPayments(tok, payers, 200, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		srv := &verifyCounter{bodies: map[string]int{}}
		ts := httptest.NewServer(srv)
		defer ts.Close()
		v := runVerify(t.Context(), &poster{base: ts.URL, hc: ts.Client()}, pays, 100, 4, 100*time.Millisecond)
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if v.Sent < 1 || v.Sent > 10 || srv.total != v.Sent || len(srv.bodies) != v.Sent || v.Payments != len(pays) {
			t.Fatalf("sent %d (server: %d requests, %d distinct bodies) of %d signed; want 1 to 10, each body once", v.Sent, srv.total, len(srv.bodies), v.Payments)
		}
	})
}
