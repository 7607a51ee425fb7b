package verify_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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
				body, _ := io.ReadAll(r.Body)
				var req struct {
					ID json.RawMessage `json:"id"`
				}
				_ = json.Unmarshal(body, &req)
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID,
					"error": map[string]any{"code": tc.code, "message": tc.message}})
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
