package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// flakyRPC is a JSON-RPC reverse proxy in front of the node that, while flaky, fails a share of
// the requests the way networks and load balancers do: it hangs up before forwarding, forwards
// and hangs up instead of answering (the node did the work: a transaction may be in its pool), or
// answers late (past the caller's RPC timeout, sometimes). The facilitator settles over HTTP
// JSON-RPC only (WebSocket is for the indexer's head subscription), so HTTP is what it proxies.
type flakyRPC struct {
	nodeLink
	flaky atomic.Bool

	forwarded, droppedBefore, droppedAfter, delayed atomic.Int64
}

// The shares of requests failed while flaky.
const (
	flakyDropBefore = 0.10
	flakyDropAfter  = 0.10
	flakyDelay      = 0.10
	flakyMaxDelay   = 3 * time.Second // the facilitator's RPC timeout is set to 2s
)

func newFlakyRPC(t *testing.T, target string) (*flakyRPC, string) {
	p := &flakyRPC{nodeLink: newNodeLink(target, true)}
	return p, serveProxy(t, p)
}

func (p *flakyRPC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	dropAfter := false
	if p.flaky.Load() {
		switch x := mrand.Float64(); {
		case x < flakyDropBefore:
			p.droppedBefore.Add(1)
			hangUp(w)
			return
		case x < flakyDropBefore+flakyDropAfter:
			dropAfter = true
		case x < flakyDropBefore+flakyDropAfter+flakyDelay:
			p.delayed.Add(1)
			select {
			case <-time.After(time.Duration(mrand.Int64N(int64(flakyMaxDelay)))):
			case <-r.Context().Done():
				return
			}
		}
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), http.MethodPost, p.target, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out, err := io.ReadAll(res.Body)
	res.Body.Close()
	p.forwarded.Add(1)
	if err != nil || dropAfter {
		if dropAfter {
			p.droppedAfter.Add(1)
		}
		hangUp(w)
		return
	}
	w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(out)
}

// hangUp closes the connection without an answer.
func hangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (p *flakyRPC) String() string {
	return fmt.Sprintf("%d requests forwarded, %d dropped before forwarding, %d answers dropped after, %d delayed",
		p.forwarded.Load(), p.droppedBefore.Load(), p.droppedAfter.Load(), p.delayed.Load())
}

// TestFaultFlakyRPC puts the flaky proxy between the facilitator and the node and drives
// concurrent /settle of distinct payments through it: no answer is a false failure (only
// success, settlement_pending, or a clean 503 when nothing was committed), every payment then
// settles with the proxy still flaky, and the audit holds: each authorization moved money exactly
// once and the ledger matches the chain.
func TestFaultFlakyRPC(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dbURL, chain := faultStack(ctx, t, "flaky_rpc")
	bin := buildFacilitator(ctx, t)
	proxy, proxyURL := newFlakyRPC(t, chain.RPCURL)
	load := newFaultLoad(ctx, t, chain, 4)
	env := serveEnv(t, dbURL, chain, proxyURL, load.key)
	env["FACILITATOR_LOG_LEVEL"] = "info"
	env["FACILITATOR_RPC_TIMEOUT"] = "2s"
	c := startServe(ctx, t, bin, env, "facilitator") // the start-up checks go through a calm proxy
	proxy.flaky.Store(true)

	stop := make(chan struct{})
	workers := load.drive(ctx, func() *child { return c }, 6, stop)
	time.Sleep(15 * time.Second)
	close(stop)
	workers.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if load.lost.Load() != 0 {
		t.Fatalf("%d requests to the facilitator got no HTTP answer", load.lost.Load())
	}
	driven := load.summary()

	// Every payment settles while the proxy is still flaky.
	load.settleAll(ctx, c)
	proxy.flaky.Store(false)
	rep := load.audit(ctx, dbURL, c)
	c.stop(t)
	t.Logf("flaky RPC: under load %s; proxy: %s", driven, proxy)
	t.Logf("flaky RPC: %s; audit: %s; took %s", load.summary(), rep, time.Since(began).Round(time.Second))
	if proxy.droppedBefore.Load() == 0 || proxy.droppedAfter.Load() == 0 || proxy.delayed.Load() == 0 {
		t.Fatalf("the proxy did not exercise every fault: %s", proxy)
	}
	if rep.discrepancies != 0 || load.refused.Load() != 0 {
		t.Fatalf("%d discrepancies, %d answers not allowed", rep.discrepancies, load.refused.Load())
	}
}
