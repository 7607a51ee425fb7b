package main

import (
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// stackConfig is what the local stack's facilitator serves: the chain's one network and USDC,
// these signer keys, and the batch policy (off when Max is 0).
type stackConfig struct {
	Binary   string // the production binary, 'facilitator'
	Listen   string // host:port; port 0 takes a free one
	DBURL    string
	LogLevel string
	Pprof    string
	Chain    *devchain.Chain
	Signers  []*ecdsa.PrivateKey
	Batch    facilitator.BatchPolicy
	// Keys serves under --auth keys (the production default) instead of open: the demo's
	// merchant then holds a key and its agent none.
	Keys bool
}

// serveArgs are serve's flags for the local stack: background jobs on short schedules, receipts
// polled often, webhooks allowed to localhost (a local merchant's receiver lives there), no API
// keys unless Keys, and no rate limits (the load command would measure the limiter). Every setting is a flag,
// so nothing in the developer's environment changes the stack behind their back.
func (sc stackConfig) serveArgs(listen string) ([]string, error) {
	v1Name, _ := facilitator.V1NetworkName(sc.Chain.ChainID)
	network := map[string]any{
		"id":     facilitator.CAIP2(sc.Chain.ChainID),
		"rpc":    sc.Chain.RPCURL,
		"ws":     sc.Chain.WSURL,
		"v1Name": v1Name,
		"tokens": []map[string]string{{"address": sc.Chain.USDC.Address.Hex(), "name": sc.Chain.USDC.Name, "version": sc.Chain.USDC.Version}},
	}
	if sc.Batch.On() {
		network["batch"] = map[string]any{"max": sc.Batch.Max, "wait": sc.Batch.Wait.String()}
	}
	networks, err := json.Marshal([]any{network})
	if err != nil {
		return nil, err
	}
	mode := "open"
	if sc.Keys {
		mode = "keys"
	}
	return []string{"serve",
		"--listen", listen,
		"--networks", string(networks),
		"--rpc-timeout", "5s", "--verify-timeout", "10s", "--status-timeout", "10s", "--settle-timeout", "30s",
		"--migrate=true", "--log-level", sc.LogLevel, "--pprof", sc.Pprof,
		"--poll-interval", "100ms", "--bump-after", "30s", "--max-in-flight", "128",
		"--index=true", "--payment-id-window", "24h",
		"--retention-schedule", "@every 10m", "--reconcile-schedule", "@every 10s",
		"--index-health-schedule", "@every 1m", "--reconcile-stale", "30s",
		"--webhook-allow-private=true", "--auth", mode,
		"--rate-per-key", "0", "--rate-per-client", "0", "--rate-public-per-client", "0",
	}, nil
}

// serveEnv is the child's environment: this process's, without any facilitator setting (flags
// carry those), with the database URL and the signer keys, which stay out of the process list.
func (sc stackConfig) serveEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FACILITATOR_") || strings.HasPrefix(kv, "DATABASE_URL=") {
			continue
		}
		env = append(env, kv)
	}
	keys := make([]string, len(sc.Signers))
	for i, k := range sc.Signers {
		keys[i] = "0x" + hex.EncodeToString(crypto.FromECDSA(k))
	}
	return append(env, "DATABASE_URL="+sc.DBURL, "FACILITATOR_SIGNER_KEYS="+strings.Join(keys, ","))
}

// served is the production binary serving the local stack, as a child process.
type served struct {
	Addr string // host:port it listens on
	stop context.CancelFunc
	done chan error // the child's exit, once
	err  error
}

// startServe runs `facilitator serve` for sc and returns once its /healthz answers. The child's
// logs go to logs. ctx bounds the start; the child runs until Close (or this process's end, by the
// signal the terminal sends both).
func startServe(ctx context.Context, sc stackConfig, logs io.Writer) (*served, error) {
	listen, err := resolveListen(sc.Listen)
	if err != nil {
		return nil, err
	}
	args, err := sc.serveArgs(listen)
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	cmd := exec.CommandContext(runCtx, sc.Binary, args...)
	cmd.Env = sc.serveEnv()
	cmd.Stdout, cmd.Stderr = logs, logs
	// serve shuts down on SIGTERM: in-flight requests finish, unfinished settlements are resumed
	// at the next start. A child that does not stop is killed after WaitDelay.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		stop()
		return nil, fmt.Errorf("starting %s: %w", sc.Binary, err)
	}
	s := &served{Addr: listen, stop: stop, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	if err := s.waitHealthy(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// waitHealthy polls /healthz until it answers 200, the child exits or ctx ends.
func (s *served) waitHealthy(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if res, err := client.Get("http://" + s.Addr + "/healthz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("facilitator serve exited before it served (its log says why): %v", err)
		case <-ctx.Done():
			return fmt.Errorf("facilitator serve did not answer /healthz on %s: %w", s.Addr, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// Close stops the child with SIGTERM and waits for it. A child already stopped by the terminal's
// Ctrl-C is not an error.
func (s *served) Close() error {
	s.stop()
	err := <-s.done
	s.done <- err
	if errors.Is(err, context.Canceled) {
		return nil // exec's word for a child that exited cleanly on our SIGTERM
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ProcessState != nil {
		if st, ok := exit.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return nil
		}
	}
	return err
}

// resolveListen picks a free port for a listen address with port 0: the child's address must be
// known to the parent, which polls it and prints it.
func resolveListen(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", listen, err)
	}
	if port != "0" {
		return listen, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// facilitatorBinary is the production binary: the one named, else 'facilitator' beside this
// executable (bin/ after 'make build', /usr/local/bin in the dev image), else on PATH.
func facilitatorBinary(named string) (string, error) {
	if named != "" {
		return named, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "facilitator")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("facilitator")
	if err != nil {
		return "", errors.New("the production binary 'facilitator' is neither beside facilitator-dev nor on PATH: 'make build' puts both in bin/, or pass --facilitator")
	}
	return p, nil
}

// newLogger is this command's own log: text, at level (info when unknown).
func newLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lv}))
}

// openDB opens a ledger (the bench's backfill database, the ledger fill grows), within 15 s.
func openDB(ctx context.Context, url string, log *slog.Logger) (*postgres.DB, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return postgres.Open(ctx, url, log)
}
