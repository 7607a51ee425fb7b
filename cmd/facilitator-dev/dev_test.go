package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestDevBatch: `facilitator-dev dev --batch-max N --batch-wait D` gives the dev network that
// batch policy; 0 is off, and a policy serve would refuse is refused before anvil starts.
func TestDevBatch(t *testing.T) {
	if p, err := devBatch(0, time.Second); p.On() || err != nil {
		t.Fatalf("--batch-max 0: %+v, %v; want off", p, err)
	}
	p, err := devBatch(30, 100*time.Millisecond)
	if err != nil || p != (facilitator.BatchPolicy{Max: 30, Wait: 100 * time.Millisecond}) {
		t.Fatalf("--batch-max 30 --batch-wait 100ms: %+v, %v", p, err)
	}
	for _, c := range []struct {
		max  int
		wait time.Duration
	}{{1, time.Second}, {101, time.Second}, {20, 3 * time.Second}, {-1, time.Second}} {
		if _, err := devBatch(c.max, c.wait); err == nil || !strings.Contains(err.Error(), "--batch-max") {
			t.Errorf("--batch-max %d --batch-wait %s: %v, want refused", c.max, c.wait, err)
		}
	}
}

// TestDevStack runs `facilitator-dev dev` on free ports with a batch policy and two signers: the
// production binary serves the fresh chain's USDC with both keys, and Ctrl-C (the context's end)
// stops it and anvil cleanly.
func TestDevStack(t *testing.T) {
	bin := facilitatorBin(t)
	dbURL := stacktest.NewDB(t, "cmddev")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	var stdout, stderr stacktest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"dev", "--listen", "127.0.0.1:0", "--anvil-port", "0", "--signers", "2",
			"--batch-max", "5", "--batch-wait", "100ms", "--facilitator", bin, "--database-url", dbURL},
			func(string) string { return "" }, &stdout, &stderr)
	}()
	var url string
	for url == "" {
		select {
		case code := <-done:
			t.Fatalf("dev exited %d before the stack was up:\n%s\n%s", code, stdout.String(), stderr.String())
		case <-ctx.Done():
			t.Fatalf("the stack never came up:\n%s\n%s", stdout.String(), stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		for _, l := range strings.Split(stdout.String(), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "facilitator" && strings.HasPrefix(f[1], "http://") {
				url = f[1]
			}
		}
	}
	if !strings.Contains(stdout.String(), "2 signer key(s) in all") {
		t.Errorf("the banner does not count two signers:\n%s", stdout.String())
	}
	res, err := http.Get(url + "/supported")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/supported: %s", res.Status)
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exited %d after Ctrl-C:\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("dev did not stop after Ctrl-C")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("the facilitator still answers after dev stopped")
	}
}

// TestDevRefusesTakenPort: `facilitator-dev dev` (make run) on a port something else holds, anvil's
// or the facilitator's, stops at once naming the port and its holder, before anvil starts (it
// used to deploy USDC onto the other process's node and die on an address mismatch).
func TestDevRefusesTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	holder := fmt.Sprintf("held by pid %d (", os.Getpid())
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"anvil's port", []string{"--anvil-port", port}, "anvil's address " + addr + " is taken (" + holder},
		{"the listen address", []string{"--anvil-port", "0", "--listen", addr}, "the facilitator's address " + addr + " is taken (" + holder},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			began := time.Now()
			err := runDev(ctx, append(c.args, "--database-url", "postgres://unused", "--facilitator", "/nonexistent"),
				func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) || time.Since(began) > 2*time.Second {
				t.Fatalf("dev %v with %s taken: %v after %s; want at once %q", c.args, addr, err, time.Since(began), c.want)
			}
			// make run asks the same before it recreates the database.
			if err := runDev(ctx, append(c.args, "--check-ports"), func(string) string { return "" }, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("dev --check-ports %v with %s taken: %v", c.args, addr, err)
			}
		})
	}
	if err := runDev(context.Background(), []string{"--check-ports", "--anvil-port", "0", "--listen", "127.0.0.1:0"},
		func(string) string { return "" }, io.Discard, io.Discard); err != nil {
		t.Fatalf("dev --check-ports on free ports, without a database: %v", err)
	}
}
