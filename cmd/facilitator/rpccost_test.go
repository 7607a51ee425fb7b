package main

import (
	"context"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// rpcCost is what a run of settlements cost the node, by component and method, per settlement.
type rpcCost map[[2]string]float64

// rpcCalls reads facilitator_rpc_calls_total by component and method.
func rpcCalls(families map[string]*dto.MetricFamily) map[[2]string]float64 {
	out := map[[2]string]float64{}
	for _, m := range families["facilitator_rpc_calls_total"].GetMetric() {
		var comp, method string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "component":
				comp = l.GetValue()
			case "method":
				method = l.GetValue()
			}
		}
		out[[2]string{comp, method}] += m.GetCounter().GetValue()
	}
	return out
}

func (c rpcCost) String() string {
	keys := make([][2]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	var b strings.Builder
	total := 0.0
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-10s %-28s %6.2f\n", k[0], k[1], c[k])
		total += c[k]
	}
	fmt.Fprintf(&b, "  %-10s %-28s %6.2f\n", "all", "", total)
	return b.String()
}

// TestRPCCallsPerSettlement runs the real wiring with heads over WebSocket, settles n payments
// from several clients at once, waits until every one is final, and reads the calls the engine,
// verify, the indexer, status and the jobs made from /metrics, per settlement. The bounds it
// asserts are the cuts (each fails with the call it removed back in); the table is the report.
func TestRPCCallsPerSettlement(t *testing.T) {
	// Blocks every 250 ms, as on a chain with a block time: several settlements share a block.
	dbURL, chain := stacktest.NewDB(t, "cmd"), stacktest.NewChain(t, devchain.Options{BlockTime: 250 * time.Millisecond})
	env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_LOG_LEVEL"] = "warn"
	// No polling: the engine and the indexer move on the heads the WebSocket announces and on
	// broadcasts alone, so the counts are the calls those cost, not the ticks of a clock.
	env["FACILITATOR_POLL_INTERVAL"] = "1h"
	env["FACILITATOR_NETWORKS"] = strings.Replace(env["FACILITATOR_NETWORKS"], `"rpc":`, `"ws":"`+chain.WSURL+`","rpc":`, 1)
	cfg := serveConfig(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m := startMain(ctx, t, cfg, newLogger(io.Discard, "error", "text"))
	defer m.Close()
	base := "http://" + m.Addr
	for deadline := time.Now().Add(30 * time.Second); ; {
		if status, _ := getReady(t, base); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	payee := chain.Accounts[2].Address
	before, err := chain.USDC.BalanceOf(ctx, payee)
	if err != nil {
		t.Fatal(err)
	}

	const n, clients = 32, 8
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = paymentBody(t, chain, chain.Accounts[2].Address, [32]byte{0x52, 0x50, 0x43, byte(i)})
	}
	start := rpcCalls(scrape(t, base))
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += clients {
				if res := post(t, base+"/settle", bodies[i]); !strings.Contains(res, `"success":true`) {
					errs <- res
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for res := range errs {
		t.Fatalf("settle: %s", res)
	}
	// Until the engine holds nothing (every settlement final): the watcher's finality reads count.
	for deadline := time.Now().Add(60 * time.Second); ; {
		open := 0
		for _, o := range m.engine.Open() {
			open += o.Count
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements still open", open)
		}
		time.Sleep(20 * time.Millisecond)
	}
	end := rpcCalls(scrape(t, base))

	after, err := chain.USDC.BalanceOf(ctx, payee)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := new(big.Int).Sub(after, before), big.NewInt(n*10000); got.Cmp(want) != 0 {
		t.Fatalf("payee received %s, want %s (each payment exactly once)", got, want)
	}
	if got := counter(t, scrape(t, base), "facilitator_settle_requests_total", map[string]string{"network": facilitator.CAIP2(chain.ChainID), "reason": "ok"}); got != n {
		t.Fatalf("settle ok count %v, want %d", got, n)
	}

	cost := rpcCost{}
	for k, v := range end {
		if d := v - start[k]; d > 0 {
			cost[k] = d / n
		}
	}
	t.Logf("JSON-RPC calls per settlement (%d settlements, %d clients), by component and method:\n%s", n, clients, cost)
	// A mined settlement's first finality read rests on the block at its height, whose hash
	// commits to the receipt; only the confirming read reads the receipt beside it again (2 per
	// settlement before: one each round).
	if got := cost[[2]string{"engine", "eth_getTransactionReceipt"}]; got > 1.5 {
		t.Errorf("engine eth_getTransactionReceipt per settlement %.2f, want at most 1.5: the watcher reads a mined receipt every round", got)
	}
	// Settlements mined in one block share its read at their height (and the head beside it).
	if got := cost[[2]string{"engine", "eth_getBlockByNumber"}]; got > 1 {
		t.Errorf("engine eth_getBlockByNumber per settlement %.2f, want at most 1: each settlement reads its block alone", got)
	}
	// The watcher asks the node for its head only beside a block read: a round woken by a
	// broadcast while the subscription is up takes the head the subscription announced.
	if got, beside := cost[[2]string{"engine", "eth_blockNumber"}], cost[[2]string{"engine", "eth_getBlockByNumber"}]; got > beside+0.1 {
		t.Errorf("engine eth_blockNumber per settlement %.2f, %.2f beside block reads: rounds woken by broadcasts ask the node for a head the subscription tells", got, beside)
	}
	if cost[[2]string{"engine", "eth_sendRawTransaction"}] < 1 {
		t.Errorf("engine eth_sendRawTransaction per settlement %.2f: the count misses the broadcasts", cost[[2]string{"engine", "eth_sendRawTransaction"}])
	}
}
