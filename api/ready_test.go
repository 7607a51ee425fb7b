package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// TestReadyz asks /readyz about a real Postgres and real RPC endpoints: anvil, a closed port,
// and a peer that accepts and never answers.
func TestReadyz(t *testing.T) {
	ctx := context.Background()
	db, err := postgres.Open(ctx, ledger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	reader := func(url string) *ethrpc.Reader {
		c, err := rpc.DialContext(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return &ethrpc.Reader{Chain: c, Timeout: 5 * time.Second}
	}
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + l.Addr().String() + "/v3/secret-provider-key"
	l.Close()
	// A peer that takes the connection and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		silent.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()

	readyz := func(t *testing.T, checks map[string]api.ReadyChecker) (int, api.ReadyResponse, string, time.Duration) {
		t.Helper()
		srv := httptest.NewServer(api.New(api.Config{Ready: checks, ReadyTimeout: 500 * time.Millisecond}).Handler())
		defer srv.Close()
		start := time.Now()
		res, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		defer res.Body.Close()
		var raw json.RawMessage
		if err := json.NewDecoder(res.Body).Decode(&raw); err != nil {
			t.Fatal(err)
		}
		var body api.ReadyResponse
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, body, string(raw), took
	}

	t.Run("all up", func(t *testing.T) {
		status, body, raw, _ := readyz(t, map[string]api.ReadyChecker{
			"postgres": api.ReadyFunc(db.Ping), "rpc:eip155:31337": reader(chain.RPCURL)})
		if status != http.StatusOK || body.Status != "ready" || body.Checks["postgres"] != "ok" || body.Checks["rpc:eip155:31337"] != "ok" {
			t.Fatalf("%d %s", status, raw)
		}
	})
	t.Run("rpc refused", func(t *testing.T) {
		// One network of two down: the other still serves, so the process stays in service,
		// degraded, naming the network.
		status, body, raw, _ := readyz(t, map[string]api.ReadyChecker{
			"postgres": api.ReadyFunc(db.Ping), "rpc:eip155:31337": reader(chain.RPCURL), "rpc:eip155:8453": reader(closedURL)})
		if status != http.StatusOK || body.Status != "degraded" || fmt.Sprint(body.Degraded) != "[eip155:8453]" {
			t.Fatalf("%d %s", status, raw)
		}
		if body.Checks["postgres"] != "ok" || body.Checks["rpc:eip155:31337"] != "ok" {
			t.Errorf("the healthy checks: %s", raw)
		}
		if state := body.Checks["rpc:eip155:8453"]; !strings.Contains(state, "connection refused") {
			t.Errorf("the closed port's state %q, want connection refused", state)
		}
		if strings.Contains(raw, "secret-provider-key") || strings.Contains(raw, "http://") {
			t.Errorf("the body shows the RPC URL, which can hold a provider key: %s", raw)
		}
	})
	t.Run("every network down", func(t *testing.T) {
		status, body, raw, _ := readyz(t, map[string]api.ReadyChecker{"postgres": api.ReadyFunc(db.Ping),
			"rpc:eip155:8453": reader(closedURL), "rpc:eip155:31337": reader(closedURL), "indexer:eip155:31337": api.ReadyFunc(func(context.Context) error { return nil })})
		if status != http.StatusServiceUnavailable || body.Status != "unready" || body.Degraded != nil {
			t.Fatalf("%d %s", status, raw)
		}
	})
	t.Run("one network's indexer lagging", func(t *testing.T) {
		status, body, raw, _ := readyz(t, map[string]api.ReadyChecker{"postgres": api.ReadyFunc(db.Ping),
			"rpc:eip155:31337": reader(chain.RPCURL), "indexer:eip155:31337": api.ReadyFunc(func(context.Context) error { return nil }),
			"rpc:eip155:8453": reader(chain.RPCURL), "indexer:eip155:8453": api.ReadyFunc(func(context.Context) error { return errors.New("lagging: 140 blocks") })})
		if status != http.StatusOK || body.Status != "degraded" || fmt.Sprint(body.Degraded) != "[eip155:8453]" || body.Checks["indexer:eip155:8453"] != "lagging: 140 blocks" {
			t.Fatalf("%d %s", status, raw)
		}
	})
	t.Run("rpc silent", func(t *testing.T) {
		status, body, raw, took := readyz(t, map[string]api.ReadyChecker{
			"postgres": api.ReadyFunc(db.Ping), "rpc:eip155:8453": reader("http://" + silent.Addr().String())})
		if status != http.StatusServiceUnavailable || body.Checks["rpc:eip155:8453"] != "timeout" || body.Checks["postgres"] != "ok" {
			t.Fatalf("%d %s", status, raw)
		}
		if took > 3*time.Second {
			t.Errorf("/readyz took %v with a 500ms bound", took)
		}
	})
	t.Run("a check ignoring its context", func(t *testing.T) {
		stuck := make(chan struct{})
		t.Cleanup(func() { close(stuck) })
		status, body, raw, took := readyz(t, map[string]api.ReadyChecker{
			"postgres": api.ReadyFunc(db.Ping), "stuck": api.ReadyFunc(func(context.Context) error { <-stuck; return nil })})
		if status != http.StatusServiceUnavailable || body.Checks["stuck"] != "timeout" || body.Checks["postgres"] != "ok" {
			t.Fatalf("%d %s", status, raw)
		}
		if took > 3*time.Second {
			t.Errorf("/readyz took %v with a 500ms bound", took)
		}
	})
	t.Run("postgres closed", func(t *testing.T) {
		closed, err := postgres.Open(ctx, ledger(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		status, body, raw, _ := readyz(t, map[string]api.ReadyChecker{
			"postgres": api.ReadyFunc(closed.Ping), "rpc:eip155:31337": reader(chain.RPCURL)})
		if status != http.StatusServiceUnavailable || body.Checks["postgres"] == "ok" || body.Checks["postgres"] == "" ||
			body.Checks["rpc:eip155:31337"] != "ok" {
			t.Fatalf("%d %s", status, raw)
		}
	})
	t.Run("nothing to check", func(t *testing.T) {
		status, body, raw, _ := readyz(t, nil)
		if status != http.StatusOK || body.Status != "ready" || body.Checks == nil || len(body.Checks) != 0 {
			t.Fatalf("%d %s", status, raw)
		}
	})
}

// TestReadyzSigners: /readyz lists each remote signer key's state, and a signer that is down
// leaves the process ready (it still verifies; /settle answers 503 with Retry-After) while the
// body says so.
func TestReadyzSigners(t *testing.T) {
	signers := map[string]string{"eip155:31337/0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266": "down: unreachable: connection refused"}
	srv := httptest.NewServer(api.New(api.Config{ReadyTimeout: 500 * time.Millisecond,
		Ready:        map[string]api.ReadyChecker{"postgres": api.ReadyFunc(func(context.Context) error { return nil })},
		ReadySigners: func() map[string]string { return signers }}).Handler())
	defer srv.Close()
	res, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body api.ReadyResponse
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || body.Status != "ready" || len(body.Signers) != 1 ||
		body.Signers["eip155:31337/0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"] != signers["eip155:31337/0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"] {
		t.Fatalf("%d %+v", res.StatusCode, body)
	}
}
