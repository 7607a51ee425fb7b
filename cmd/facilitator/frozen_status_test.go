package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestStatusLookupsWhenTheNodeFreezes: with the node frozen (connections open, nothing answered),
// the status lookups answer 503 status_timeout within --status-timeout instead of hanging until
// the node comes back (they hung 90 s). The facilitator reads the chain through a TCP proxy in
// front of anvil, frozen once a payment has settled.
func TestStatusLookupsWhenTheNodeFreezes(t *testing.T) {
	dbURL, chain := stacktest.NewDB(t, "cmd"), stacktest.NewChain(t, devchain.Options{})
	proxy := stacktest.NewProxy(t, strings.TrimPrefix(chain.RPCURL, "http://"))
	rpcURL := "http://" + strings.TrimPrefix(proxy.URL(), "ws://")
	env := serveEnv(t, dbURL, chain, rpcURL, chain.Accounts[0].Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_LOG_LEVEL"] = "warn"
	env["FACILITATOR_STATUS_TIMEOUT"] = "2s"
	cfg := serveConfig(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := startMain(ctx, t, cfg, newLogger(t.Output(), "error", "text"))
	defer m.Close()
	base := "http://" + m.Addr
	waitReady(t, base)

	nonce := [32]byte{0x46, 0x52, 0x5a}
	var settled struct {
		Success     bool   `json:"success"`
		Transaction string `json:"transaction"`
	}
	if err := json.Unmarshal([]byte(post(t, base+"/settle", paymentBody(t, chain, chain.Accounts[2].Address, nonce))), &settled); err != nil || !settled.Success {
		t.Fatalf("settle: %+v %v", settled, err)
	}
	proxy.SetMode(stacktest.Freeze)
	defer proxy.SetMode(stacktest.Forward)

	auth := fmt.Sprintf("%s/%s/%s/", facilitator.CAIP2(chain.ChainID), chain.USDC.Address.Hex(), chain.Accounts[1].Address.Hex())
	// The client gives up long after the bound: a lookup that hangs fails the test, not the run.
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, path := range []string{
		"/v1/authorizations/" + auth + "0x" + hex.EncodeToString(nonce[:]), // in the ledger: read at the head
		"/v1/authorizations/" + auth + "0x" + strings.Repeat("46", 32),     // unknown: the chain's word
		"/v1/settlements/" + settled.Transaction,
	} {
		res, err := hc.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s with the node frozen: %v", path, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if res.StatusCode != http.StatusServiceUnavailable || e.Error != facilitator.ReasonStatusTimeout || res.Header.Get("Retry-After") == "" {
			t.Errorf("GET %s with the node frozen: %d %s (Retry-After %q); want 503 %s with Retry-After", path, res.StatusCode, b, res.Header.Get("Retry-After"), facilitator.ReasonStatusTimeout)
		}
	}
}
