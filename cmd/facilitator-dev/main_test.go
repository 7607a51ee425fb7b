package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// requireStack is a fresh database and a fresh anvil with Circle's USDC.
func requireStack(t *testing.T) (string, *devchain.Chain) {
	t.Helper()
	return stacktest.NewDB(t, "cmddev"), stacktest.NewChain(t, devchain.Options{})
}

var built struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// facilitatorBin is the production binary, built once per test binary: dev and demo serve with it.
// Without a go toolchain it skips, and fails under CI=true, like a missing anvil.
func facilitatorBin(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "facilitator-dev-test-*")
		if err != nil {
			built.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		built.path = filepath.Join(dir, "facilitator")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", built.path, "github.com/x402-facilitator/x402-facilitator/cmd/facilitator")
		built.out, built.err = cmd.CombinedOutput()
	})
	if built.err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("building the production binary: %v\n%s", built.err, built.out)
		}
		t.Skipf("building the production binary: %v\n%s", built.err, built.out)
	}
	return built.path
}
