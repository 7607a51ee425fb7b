package ethrpc_test

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

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// TestReaderClassifiesErrors: only what the node executed and rejected counts as a revert (a
// verdict on the payment); overload, timeouts and transport failures are errors (no verdict).
func TestReaderClassifiesErrors(t *testing.T) {
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
			r := batchNode(t, tc.status, func(method string) map[string]any {
				// The reader batches its reads with eth_blockNumber (the answering node's head).
				if method == "eth_blockNumber" {
					return map[string]any{"result": "0x1"}
				}
				return map[string]any{"error": map[string]any{"code": tc.code, "message": tc.message}}
			})
			read := &ethrpc.Read{To: common.Address{1}, Data: []byte{0x12}}
			err := r.Read(context.Background(), read)
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

// TestReaderRefusesLaggingAnswers: behind a load balancer, a backend whose head is behind one
// the reader has already seen answers from its past (a payer funded since has "no balance"): its
// answer is not used; the read is made again, and fails (not known) while every answer lags. A
// node that caught up is used again.
func TestReaderRefusesLaggingAnswers(t *testing.T) {
	var head, requests atomic.Int64
	head.Store(10)
	r := batchNode(t, 200, func(method string) map[string]any {
		requests.Add(1)
		if method == "eth_call" {
			return map[string]any{"result": "0x" + strings.Repeat("0", 63) + strconv.FormatInt(head.Load()%2, 10)}
		}
		return map[string]any{"result": "0x" + strconv.FormatInt(head.Load(), 16)}
	})
	read := func() error {
		return r.Read(context.Background(), &ethrpc.Read{To: common.Address{1}, Data: []byte{0x12}})
	}
	if err := read(); err != nil {
		t.Fatalf("a read at head 10: %v", err)
	}
	head.Store(8) // every backend now answers from two blocks back
	requests.Store(0)
	if err := read(); err == nil || !strings.Contains(err.Error(), "behind") {
		t.Fatalf("a read answered only by lagging nodes: %v, want an error (not known)", err)
	}
	if n := requests.Load(); n != 6 {
		t.Fatalf("%d calls while lagging, want 3 tries of 2", n)
	}
	head.Store(11)
	if err := read(); err != nil {
		t.Fatalf("a read after the node caught up: %v", err)
	}
}

// batchNode is a reader over a JSON-RPC node that answers every batch element with answer(method)
// (a "result" or an "error"), or the whole request with HTTP status when it is not 200.
func batchNode(t *testing.T, status int, answer func(method string) map[string]any) *ethrpc.Reader {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status != 200 {
			http.Error(w, "overloaded", status)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var reqs []struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &reqs)
		var out []map[string]any
		for _, req := range reqs {
			a := answer(req.Method)
			a["jsonrpc"], a["id"] = "2.0", req.ID
			out = append(out, a)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	client, err := rpc.DialContext(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return &ethrpc.Reader{Chain: client, Timeout: 2 * time.Second}
}
