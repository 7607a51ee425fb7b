// The project's one rule for missing tools: under CI=true a chain that cannot start (or a database
// that cannot be made) fails the run; elsewhere the package is skipped with a message saying how to
// run it ('make test').

package stacktest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/devchain"
)

// mainChain starts a chain, calls run (which sets up whatever else the package needs and returns
// m.Run()'s code), closes the chain and exits. An error from Start or from run's set-up counts as
// a missing dependency.
func mainChain(_ *testing.M, opts devchain.Options, run func(c *devchain.Chain) (int, error)) {
	os.Exit(chainMain(opts, run))
}

func chainMain(opts devchain.Options, run func(c *devchain.Chain) (int, error)) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := devchain.Start(ctx, opts)
	cancel()
	if err == nil {
		defer c.Close()
		var code int
		if code, err = run(c); err == nil {
			return code
		}
	}
	if os.Getenv("CI") == "true" {
		fmt.Fprintf(os.Stderr, "FAIL: these tests need anvil, node and node_modules (run 'make test'): %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "SKIP: these tests need anvil, node and node_modules (run 'make test'): %v\n", err)
	return 0
}

// NewChain is a chain of the test's own, closed when the test ends; one that cannot start fails
// the test under CI=true and skips it elsewhere.
func NewChain(t testing.TB, opts devchain.Options) *devchain.Chain {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := devchain.Start(ctx, opts)
	if err != nil {
		missing(t, "this test needs anvil, node and node_modules (run 'make test'): %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// missing fails the test under CI=true and skips it elsewhere.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// ManualMining switches c's auto-mine off for the rest of the test. Call it before building
// anything that sends transactions, so that at cleanup those stop first; then auto-mine is back on
// and every leftover transaction is mined (or, failing that, dropped and reported), so later tests
// start from an empty pool.
func ManualMining(t testing.TB, c *devchain.Chain) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.RPC.CallContext(ctx, nil, "anvil_setAutomine", false); err != nil {
		t.Fatalf("anvil_setAutomine false: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.RPC.CallContext(ctx, nil, "anvil_setAutomine", true); err != nil {
			t.Errorf("anvil_setAutomine true: %v", err)
		}
		for range 5 {
			n, err := PoolSize(ctx, c)
			if err != nil {
				t.Errorf("txpool_status: %v", err)
				return
			}
			if n == 0 {
				return
			}
			if err := c.Mine(ctx); err != nil {
				t.Errorf("evm_mine: %v", err)
			}
		}
		t.Errorf("transactions still pending after mining; dropping them")
		_ = c.RPC.CallContext(ctx, nil, "anvil_dropAllTransactions")
	})
}

// PoolSize is the number of transactions in anvil's pool, pending and queued.
func PoolSize(ctx context.Context, c *devchain.Chain) (int, error) {
	var st struct {
		Pending hexutil.Uint64 `json:"pending"`
		Queued  hexutil.Uint64 `json:"queued"`
	}
	if err := c.RPC.CallContext(ctx, &st, "txpool_status"); err != nil {
		return 0, err
	}
	return int(st.Pending + st.Queued), nil
}
