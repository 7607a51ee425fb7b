package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The helpers here run the real binary (`facilitator serve`) for the tests that stop, kill or
// starve it: crash, replicas and faults.

// serveEnv is the environment of a `facilitator serve` settling on chain's USDC through rpcURL
// (the chain's own RPC, or a proxy in front of it) with keys, on dbURL: open auth and no
// per-client rate limit (these tests are about settlement), fast receipt polling, finality 1.
// Callers add or override entries.
func serveEnv(t *testing.T, dbURL string, chain *devchain.Chain, rpcURL string, keys ...*ecdsa.PrivateKey) map[string]string {
	t.Helper()
	networks, err := json.Marshal([]map[string]any{{
		"id": facilitator.CAIP2(chain.ChainID), "rpc": rpcURL, "finality": 1,
		"tokens": []map[string]string{{"address": chain.USDC.Address.Hex(), "name": chain.USDC.Name, "version": chain.USDC.Version}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	hexKeys := make([]string, len(keys))
	for i, k := range keys {
		hexKeys[i] = "0x" + hex.EncodeToString(crypto.FromECDSA(k))
	}
	return map[string]string{
		"DATABASE_URL":                dbURL,
		"FACILITATOR_NETWORKS":        string(networks),
		"FACILITATOR_SIGNER_KEYS":     strings.Join(hexKeys, ","),
		"FACILITATOR_POLL_INTERVAL":   "50ms",
		"FACILITATOR_SETTLE_TIMEOUT":  "5s",
		"FACILITATOR_LOG_LEVEL":       "debug",
		"FACILITATOR_AUTH":            "open", // settlement tests, not API keys
		"FACILITATOR_RATE_PER_CLIENT": "0",    // nor rate limits: the test client is one address
	}
}

// child is one run of the binary.
type child struct {
	name   string
	cmd    *exec.Cmd
	logs   *stacktest.SyncBuffer
	exited chan struct{}
	base   string
	client *http.Client
}

// startServe runs `facilitator serve` with env (and nothing of the test's own FACILITATOR_* or
// DATABASE_URL settings) on a free port, and returns once it answers /healthz. The process is
// killed at cleanup if still running, and its output is logged if the test failed.
func startServe(ctx context.Context, t *testing.T, bin string, env map[string]string, name string) *child {
	t.Helper()
	c := launchServe(t, bin, env, name)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-c.exited:
			t.Fatalf("%s exited before serving: %v", name, c.cmd.ProcessState)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		default:
		}
		res, err := c.client.Get(c.base + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not serve /healthz after 30s (last error %v)", name, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// launchServe starts the process and returns at once.
func launchServe(t *testing.T, bin string, env map[string]string, name string) *child {
	t.Helper()
	addr := freeAddr(t)
	return launch(t, bin, env, name, addr, "serve", "--listen", addr)
}

// launch runs bin with args and env (and nothing of the test's own FACILITATOR_* or DATABASE_URL
// settings), its base URL at addr, and returns at once.
func launch(t *testing.T, bin string, env map[string]string, name, addr string, args ...string) *child {
	t.Helper()
	c := startProcess(t, bin, env, name, nil, args...)
	c.base, c.client = "http://"+addr, &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	return c
}

// startProcess runs bin with args and env, and nothing of the test's own FACILITATOR_*,
// DATABASE_URL or drop (prefixes of "NAME=") settings, and returns at once. Its output is shown
// if the test fails; it is killed when the test ends.
func startProcess(t *testing.T, bin string, env map[string]string, name string, drop []string, args ...string) *child {
	t.Helper()
	var list []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FACILITATOR_") && !strings.HasPrefix(kv, "DATABASE_URL=") &&
			!slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			list = append(list, kv)
		}
	}
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	c := &child{name: name, logs: &stacktest.SyncBuffer{}, exited: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = list
	c.cmd.Stdout, c.cmd.Stderr = c.logs, c.logs
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s output:\n%s", c.name, c.logs.String())
		}
	})
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	// Registered after the log dump, so it runs first: the dump then holds everything.
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// settle posts a /settle body. err is a transport failure (the process died mid-request).
func (c *child) settle(body []byte) (facilitator.SettleResponse, int, error) {
	var out facilitator.SettleResponse
	res, err := c.client.Post(c.base+"/settle", "application/json", bytes.NewReader(body))
	if err != nil {
		return out, 0, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return out, res.StatusCode, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, res.StatusCode, fmt.Errorf("answer %d is not a settle response: %w: %s", res.StatusCode, err, raw)
	}
	return out, res.StatusCode, nil
}

func (c *child) waitExit(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(within):
		t.Fatalf("%s still runs %s later", c.name, within)
	}
}

// kill sends SIGKILL and checks that the process died of it.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.waitKilled(t, 10*time.Second)
}

// waitKilled waits for the process to end and checks that it died of SIGKILL.
func (c *child) waitKilled(t *testing.T, within time.Duration) {
	t.Helper()
	c.waitExit(t, within)
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s ended with %v, want death by SIGKILL", c.name, c.cmd.ProcessState)
	}
}

// stop sends SIGTERM and expects a clean exit.
func (c *child) stop(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.waitExit(t, 10*time.Second)
	if code := c.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM (%v), want 0", c.name, code, c.cmd.ProcessState)
	}
}

// buildFacilitator builds this package's real binary.
func buildFacilitator(ctx context.Context, t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "facilitator")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// freeAddr is a loopback address with a port nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}
