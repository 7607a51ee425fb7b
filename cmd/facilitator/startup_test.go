package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/metrics"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestServeStartsDegraded: serve starts with one of a network's two endpoints never answering
// (within --rpc-timeout, naming rpc1 and never its URL) and with every endpoint of a second
// network refusing everything. The first network serves; the second answers 503
// network_unavailable, and /readyz says so; once its endpoint answers, it serves without a restart.
func TestServeStartsDegraded(t *testing.T) {
	dbURL, chainA := requireStack(t)
	chainB := stacktest.NewChain(t, devchain.Options{ChainID: 31338})
	down, downURL := newLaggyRPC(t, chainB.RPCURL)
	down.set(&laggyFaults{Error: 1})
	hole, _ := blackhole(t)
	// A third endpoint of the first network is another chain's, refusing everything at start: once
	// it answers, its chain is checked before it serves, and it is kept out.
	wrong, wrongURL := newLaggyRPC(t, chainB.RPCURL)
	wrong.set(&laggyFaults{Error: 1})
	hole += "/v2/SECRETKEY" // a provider's API key, which must appear in no log line

	env := serveEnv(t, dbURL, chainA, chainA.RPCURL, chainA.Accounts[0].Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_RPC_TIMEOUT"] = "1s"
	env["FACILITATOR_NETWORKS"] = `[` +
		`{"id":"eip155:31337","rpcs":["` + chainA.RPCURL + `","` + hole + `","` + wrongURL + `"],"quorum":1,"finality":1,"tokens":[{"address":"` + chainA.USDC.Address.Hex() + `","name":"` + chainA.USDC.Name + `","version":"` + chainA.USDC.Version + `"}]},` +
		`{"id":"eip155:31338","rpc":"` + downURL + `","finality":1,"tokens":[{"address":"` + chainB.USDC.Address.Hex() + `","name":"` + chainB.USDC.Name + `","version":"` + chainB.USDC.Version + `"}]}]`
	cfg := serveConfig(t, env)
	logs := &stacktest.SyncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	m := startMain(ctx, t, cfg, newLogger(logs, "info", "text"))
	defer m.Close()
	if took := time.Since(began); took > 15*time.Second {
		t.Fatalf("serve took %s to start: a silent endpoint must cost --rpc-timeout (1s), not more", took)
	}
	base := "http://" + m.Addr
	for _, want := range []string{"waiting for an RPC endpoint", "endpoint=rpc1", "no answer within --rpc-timeout (1s)", "network=eip155:31338"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("start-up logs lack %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "SECRETKEY") {
		t.Fatalf("an endpoint's URL leaked into the logs:\n%s", logs.String())
	}

	post := func(path string, body []byte) (int, string) {
		t.Helper()
		res, err := http.Post(base+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := post("/verify", paymentBody(t, chainA, chainA.Accounts[2].Address, [32]byte{1})); code != 200 || !strings.Contains(body, `"isValid":true`) {
		t.Fatalf("verify on the degraded network: %d %s", code, body)
	}
	bodyB := paymentBody(t, chainB, chainB.Accounts[2].Address, [32]byte{2})
	if code, body := post("/verify", bodyB); code != 503 || !strings.Contains(body, "network_unavailable") {
		t.Fatalf("verify on the network that is down: %d %s", code, body)
	}
	if code, body := post("/settle", bodyB); code != 503 || !strings.Contains(body, "network_unavailable") {
		t.Fatalf("settle on the network that is down: %d %s", code, body)
	}
	res, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(ready), "eip155:31337/rpc1") || !strings.Contains(string(ready), "eip155:31338") ||
		!strings.Contains(string(ready), "not serving yet") || strings.Contains(string(ready), "SECRETKEY") {
		t.Fatalf("/readyz: %d %s", res.StatusCode, ready)
	}
	// The network that serves keeps the process in service: an orchestrator taking it out for the
	// other's outage would stop both.
	if res.StatusCode != 200 || !strings.Contains(string(ready), `"status":"degraded"`) || !strings.Contains(string(ready), `"degraded":["eip155:31338"]`) {
		t.Fatalf("/readyz with one network of two serving: %d %s, want 200 degraded naming eip155:31338", res.StatusCode, ready)
	}

	res, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !hasLine(string(metricsText), "facilitator_rpc_endpoint_up{", `endpoint="rpc1"`, `network="eip155:31337"`, "} 0") ||
		!hasLine(string(metricsText), "facilitator_rpc_endpoint_up{", `endpoint="rpc0"`, `network="eip155:31337"`, "} 1") {
		t.Fatalf("/metrics does not show rpc1 down and rpc0 up:\n%s", metricsText)
	}

	// Its provider comes back: the network serves, no restart. The other chain's endpoint answers
	// too, and is kept out.
	down.set(nil)
	wrong.set(nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := post("/verify", bodyB)
		if code == 200 && strings.Contains(body, `"isValid":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the network did not come up once its endpoint answered: %d %s\n%s", code, body, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The signer key is recovered by the engine's lease loop (every second), so a /settle may
	// meet it not yet held: a 503 to retry.
	for {
		code, body := post("/settle", bodyB)
		if code == 200 && strings.Contains(body, `"success":true`) {
			break
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("settle once the network is up: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := byte(0); ; i++ {
		if code, body := post("/verify", paymentBody(t, chainA, chainA.Accounts[2].Address, [32]byte{3, i})); code != 200 || !strings.Contains(body, `"isValid":true`) {
			t.Fatalf("verify with another chain's endpoint answering: %d %s", code, body)
		}
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		ready, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(ready), "the RPC serves chain 31338") {
			break
		}
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("/readyz never said rpc2 serves another chain: %s", ready)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// hasLine reports whether text has a line holding every part.
func hasLine(text string, parts ...string) bool {
	for _, l := range strings.Split(text, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestGatedViewKeepsQuorum: each component's view of a pool (gated, counted) still offers the
// pool's corroborated reads. A view that hid them was taken by settle for a single endpoint, and
// one lying provider's receipt made a settlement "mined" (TestQuorumInventedReceipt).
func TestGatedViewKeepsQuorum(t *testing.T) {
	var none ethrpc.Chain = (*rpc.Client)(nil)
	pool, err := ethrpc.NewPool([]ethrpc.Endpoint{{Name: "rpc0", Chain: none}, {Name: "rpc1", Chain: none}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	gate := &netGate{}
	for _, withMetrics := range []bool{false, true} {
		m := &Main{gates: map[string]*netGate{"eip155:1": gate}}
		if withMetrics {
			m.metrics = metrics.New()
		}
		view := m.counted(pool, "eip155:1", "engine")
		q, ok := view.(interface {
			Quorum() int
			Several(n int, except ...string) ([]ethrpc.Chain, bool)
		})
		if !ok || q.Quorum() != 2 {
			t.Fatalf("metrics %v: the engine's view of a two-endpoint pool lost its quorum (%T)", withMetrics, view)
		}
		if _, ok := q.Several(2); ok {
			t.Fatalf("metrics %v: a closed network's view names endpoints", withMetrics)
		}
		gate.open()
		if _, ok := q.Several(2); !ok {
			t.Fatalf("metrics %v: an open network's view names no endpoints", withMetrics)
		}
		gate = &netGate{}
	}
}
