package verify_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/verify"
)

// TestRPCReaderClassifiesErrors: only what the node executed and rejected counts as a revert (a
// verdict on the payment); overload, timeouts and transport failures are errors (no verdict).
func TestRPCReaderClassifiesErrors(t *testing.T) {
	cases := []struct {
		name       string
		status     int
		code       int
		message    string
		wantRevert bool
	}{
		{"geth revert, code 3", 200, 3, "execution reverted: FiatTokenV2: invalid signature", true},
		{"anvil revert", 200, -32603, "EvmError: Revert", true},
		{"plain revert text", 200, -32000, "execution reverted", true},
		{"geth call timeout", 200, -32000, "execution aborted (timeout = 5s)", false},
		{"gas cap", 200, -32000, "err: exceeds block gas limit", false},
		{"provider rate limit", 200, -32005, "rate limit exceeded", false},
		{"unknown node error", 200, -32000, "header not found", false},
		{"HTTP 503", 503, 0, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status != 200 {
					http.Error(w, "overloaded", tc.status)
					return
				}
				// The reader batches its reads with eth_blockNumber (the answering node's head).
				body, _ := io.ReadAll(r.Body)
				var reqs []struct {
					ID     json.RawMessage `json:"id"`
					Method string          `json:"method"`
				}
				_ = json.Unmarshal(body, &reqs)
				var out []map[string]any
				for _, req := range reqs {
					if req.Method == "eth_blockNumber" {
						out = append(out, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": "0x1"})
						continue
					}
					out = append(out, map[string]any{"jsonrpc": "2.0", "id": req.ID,
						"error": map[string]any{"code": tc.code, "message": tc.message}})
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(out)
			}))
			defer srv.Close()
			client, err := rpc.DialContext(context.Background(), srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			r := &verify.RPCReader{Client: client, Timeout: 2 * time.Second}
			read := &verify.Read{To: common.Address{1}, Data: []byte{0x12}}
			err = r.Read(context.Background(), read)
			if tc.wantRevert {
				if err != nil || !read.Reverted {
					t.Fatalf("want a revert, got err=%v reverted=%v", err, read.Reverted)
				}
				return
			}
			if err == nil {
				t.Fatalf("want an error (no verdict), got reverted=%v", read.Reverted)
			}
		})
	}
}

// TestRPCReaderRefusesLaggingAnswers: behind a load balancer, a backend whose head is behind one
// the reader has already seen answers from its past (a payer funded since has "no balance"): its
// answer is not used; the read is made again, and fails (not known) while every answer lags. A
// node that caught up is used again.
func TestRPCReaderRefusesLaggingAnswers(t *testing.T) {
	var head, requests atomic.Int64
	head.Store(10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		var reqs []struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &reqs)
		var out []map[string]any
		for _, req := range reqs {
			result := "0x" + strconv.FormatInt(head.Load(), 16) // the head, and a word for the call
			if req.Method == "eth_call" {
				result = "0x" + strings.Repeat("0", 63) + strconv.FormatInt(head.Load()%2, 10)
			}
			out = append(out, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer srv.Close()
	client, err := rpc.DialContext(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	r := &verify.RPCReader{Client: client, Timeout: 2 * time.Second}
	read := func() error {
		return r.Read(context.Background(), &verify.Read{To: common.Address{1}, Data: []byte{0x12}})
	}
	if err := read(); err != nil {
		t.Fatalf("a read at head 10: %v", err)
	}
	head.Store(8) // every backend now answers from two blocks back
	requests.Store(0)
	if err := read(); err == nil || !strings.Contains(err.Error(), "behind") {
		t.Fatalf("a read answered only by lagging nodes: %v, want an error (not known)", err)
	}
	if n := requests.Load(); n != 3 {
		t.Fatalf("%d requests while lagging, want 3 tries", n)
	}
	head.Store(11)
	if err := read(); err != nil {
		t.Fatalf("a read after the node caught up: %v", err)
	}
}
