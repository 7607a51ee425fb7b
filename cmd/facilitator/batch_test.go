package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBatchConfig: a network's "batch" entry becomes its batch policy; absent is off, and
// nonsense is refused with the network and the field named.
func TestBatchConfig(t *testing.T) {
	env := func(batch string) map[string]string {
		n := `{"id":"eip155:8453","rpc":"http://127.0.0.1:1","tokens":[{"address":"0x0000000000000000000000000000000000000001","name":"USD Coin","version":"2"}]`
		if batch != "" {
			n += `,"batch":` + batch
		}
		return map[string]string{"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": "[" + n + "}]"}
	}
	domain := func(batch string) ([]facilitator.Network, error) {
		e := env(batch)
		cfg, err := parseServeFlags(nil, func(k string) string { return e[k] })
		if err != nil {
			return nil, err
		}
		return cfg.Domain()
	}
	ns, err := domain("")
	if err != nil || ns[0].Batch.On() {
		t.Fatalf("no batch entry: %+v, %v", ns, err)
	}
	ns, err = domain(`{"max":20,"wait":"150ms"}`)
	if err != nil || ns[0].Batch != (facilitator.BatchPolicy{Max: 20, Wait: 150 * time.Millisecond}) {
		t.Fatalf("batch: %+v, %v", ns, err)
	}
	for batch, says := range map[string]string{
		`{"max":101,"wait":"1s"}`: "batch max 101",
		`{"max":1}`:               "at least 2",
		`{"max":5,"wait":"3s"}`:   "batch wait 3s",
		`{"max":5,"wait":"soon"}`: `wait "soon"`,
	} {
		_, err := domain(batch)
		if err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "eip155:8453") {
			t.Errorf("%s: %v, want an error naming the network and %q", batch, err, says)
		}
	}
}

// TestServeRefusesBatchWithoutMulticall3: on a chain with no code at Multicall3's address, serve
// with a network that batches refuses to start, naming the network and Multicall3 (every batch
// would be a call to an empty account that succeeds transferring nothing: nothing is ever
// answered batch_call_failed, because nothing is ever sent); --check-config says the same; the
// same network without its batch entry serves.
func TestServeRefusesBatchWithoutMulticall3(t *testing.T) {
	dbURL := stacktest.NewDB(t, "cmd")
	chain := stacktest.NewChain(t, devchain.Options{NoMulticall3: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if code, err := chain.Client.CodeAt(ctx, chain.Multicall3, nil); err != nil || len(code) != 0 {
		t.Fatalf("Multicall3's address holds %d bytes (%v), want none", len(code), err)
	}
	envWith := func(batch bool) map[string]string {
		env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
		env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
		if batch {
			var nets []map[string]any
			if err := json.Unmarshal([]byte(env["FACILITATOR_NETWORKS"]), &nets); err != nil {
				t.Fatal(err)
			}
			nets[0]["batch"] = map[string]any{"max": 5, "wait": "100ms"}
			b, _ := json.Marshal(nets)
			env["FACILITATOR_NETWORKS"] = string(b)
		}
		return env
	}
	serve := func(env map[string]string) (*Main, error) {
		cfg := serveConfig(t, env)
		m := &Main{Config: cfg, Logger: newLogger(&stacktest.SyncBuffer{}, "debug", "json")}
		err := m.Run(ctx)
		t.Cleanup(func() { _ = m.Close() })
		return m, err
	}
	network := facilitator.CAIP2(chain.ChainID)
	if _, err := serve(envWith(true)); err == nil || !strings.Contains(err.Error(), "no Multicall3") || !strings.Contains(err.Error(), network) {
		t.Fatalf("serve with batching on a chain without Multicall3: %v, want refused naming %s and Multicall3", err, network)
	}
	env := envWith(true)
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"serve", "--check-config"}, func(k string) string { return env[k] }, &out, &errOut); code == 0 ||
		!strings.Contains(out.String(), "FAIL  "+network+": batched settlement") {
		t.Fatalf("--check-config: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	m, err := serve(envWith(false))
	if err != nil {
		t.Fatalf("serve without batching on the same chain: %v", err)
	}
	if res, err := http.Get("http://" + m.Addr + "/supported"); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/supported without batching: %v, %v", res, err)
	}
}
