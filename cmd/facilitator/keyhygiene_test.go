package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestKeyFileMode: a signer keys file anyone but its owner may read or write is refused, naming the
// file, its mode and the fix; 0600 and 0400 are read.
func TestKeyFileMode(t *testing.T) {
	const key = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d\n"
	for _, c := range []struct {
		mode    os.FileMode
		refused bool
	}{
		{0o600, false},
		{0o400, false},
		{0o640, true},
		{0o644, true},
		{0o604, true},
		{0o620, true},
		{0o666, true},
	} {
		t.Run(fmt.Sprintf("%#o", c.mode), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "keys")
			if err := os.WriteFile(file, []byte(key), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, c.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			keys, err := readSignerKeys("", file)
			if !c.refused {
				if err != nil || len(keys) != 1 {
					t.Fatalf("keys %d, error %v; want the key read", len(keys), err)
				}
				return
			}
			want := fmt.Sprintf("signer keys file %s has mode %#o, open to group or others: it must be 0600 or stricter (chmod 600 %s)", file, c.mode, file)
			if err == nil || err.Error() != want {
				t.Fatalf("error %v, want %s", err, want)
			}
			if strings.Contains(err.Error(), strings.TrimSpace(key)[2:]) {
				t.Fatal("the error carries the key")
			}
		})
	}
}

// TestKeyOpenAuthExposed: open auth is warned about on every address but loopback; keys mode never.
func TestKeyOpenAuthExposed(t *testing.T) {
	for _, c := range []struct {
		auth, addr string
		want       bool
	}{
		{"open", "127.0.0.1:4021", false},
		{"open", "127.1.2.3:4021", false},
		{"open", "[::1]:4021", false},
		{"open", "[::]:4021", true},
		{"open", "0.0.0.0:4021", true},
		{"open", "10.0.0.5:4021", true},
		{"open", "[2001:db8::1]:4021", true},
		{"open", "not an address", true},
		{"keys", "0.0.0.0:4021", false},
		{"keys", "[::]:4021", false},
		{"", "0.0.0.0:4021", false}, // "" is keys mode (authConfig)
	} {
		if got := openToNetwork(c.auth, c.addr); got != c.want {
			t.Errorf("openToNetwork(%q, %q) = %v, want %v", c.auth, c.addr, got, c.want)
		}
	}
}

// TestKeyShutdownLogged: a shutdown says which signal asked for it, that it drains, and when it
// has stopped (or that it stopped with errors).
func TestKeyShutdownLogged(t *testing.T) {
	for _, c := range []struct {
		name     string
		closeErr error
		want     []string
	}{
		{"clean", nil, []string{`level=INFO msg="shutting down: draining requests in flight`, `cause="terminated signal received"`, `level=INFO msg=stopped took=`}},
		{"errors", errors.New("engine: stuck"), []string{`msg="shutting down: draining`, `level=ERROR msg="stopped, with errors"`, `err="engine: stuck"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			ctx, cancel := context.WithCancelCause(context.Background())
			// What signal.NotifyContext's context is canceled with on SIGTERM.
			cancel(errors.New("terminated signal received"))
			closed := false
			err := awaitShutdown(ctx, slog.New(slog.NewTextHandler(&logs, nil)), func() error { closed = true; return c.closeErr })
			if !closed || !errors.Is(err, c.closeErr) {
				t.Fatalf("closed %v, error %v", closed, err)
			}
			for _, w := range c.want {
				if !strings.Contains(logs.String(), w) {
					t.Errorf("log lacks %s:\n%s", w, logs.String())
				}
			}
		})
	}
}

// TestKeyServeLogsExposureAndShutdown runs serve as main does, open on every interface: its log
// warns of open auth at start, and on the signal says what stopped it, that it drains, and that
// it stopped. On loopback with keys there is no warning.
func TestKeyServeLogsExposureAndShutdown(t *testing.T) {
	dbURL, chain := requireStack(t)
	for _, c := range []struct {
		auth, listen string
		warned       bool
	}{
		{"open", "0.0.0.0:0", true},
		{"keys", "127.0.0.1:0", false},
	} {
		t.Run(c.auth+" "+c.listen, func(t *testing.T) {
			env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
			env["FACILITATOR_LISTEN"], env["FACILITATOR_AUTH"] = c.listen, c.auth
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var stdout bytes.Buffer
			logs := &stacktest.SyncBuffer{}
			done := make(chan int, 1)
			go func() { done <- run(ctx, []string{"serve"}, func(k string) string { return env[k] }, &stdout, logs) }()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(logs.String(), "facilitator listening") {
				if time.Now().After(deadline) {
					t.Fatalf("serve did not start:\n%s", logs.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel(errors.New("terminated signal received")) // what signal.NotifyContext cancels with on SIGTERM
			select {
			case code := <-done:
				if code != 0 {
					t.Fatalf("exit %d:\n%s", code, logs.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("serve did not stop")
			}
			out := logs.String()
			if got := strings.Contains(out, "OPEN AUTH ON A NETWORK ADDRESS"); got != c.warned {
				t.Errorf("warned %v, want %v:\n%s", got, c.warned, out)
			}
			for _, want := range []string{`msg="shutting down: draining requests in flight`, `cause="terminated signal received"`, `msg=stopped took=`} {
				if !strings.Contains(out, want) {
					t.Errorf("the log lacks %s:\n%s", want, out)
				}
			}
		})
	}
}
