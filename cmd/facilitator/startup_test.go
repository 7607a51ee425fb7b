package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
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
	hole += "/v2/SECRETKEY" // a provider's API key, which must appear in no log line

	env := serveEnv(t, dbURL, chainA, chainA.RPCURL, chainA.Accounts[0].Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_RPC_TIMEOUT"] = "1s"
	env["FACILITATOR_NETWORKS"] = `[` +
		`{"id":"eip155:31337","rpcs":["` + chainA.RPCURL + `","` + hole + `"],"quorum":1,"finality":1,"tokens":[{"address":"` + chainA.USDC.Address.Hex() + `","name":"` + chainA.USDC.Name + `","version":"` + chainA.USDC.Version + `"}]},` +
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

	// Its provider comes back: the network serves, no restart.
	down.set(nil)
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
	if code, body := post("/settle", bodyB); code != 200 || !strings.Contains(body, `"success":true`) {
		t.Fatalf("settle once the network is up: %d %s", code, body)
	}
}
