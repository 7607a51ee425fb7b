// Package devchaintest gives test binaries a devchain with the project's one rule for missing
// tools: under CI=true a chain that cannot start fails the run; elsewhere the package is skipped
// with a message saying how to run it ('make test').
package devchaintest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
)

// Main is for a package's TestMain: it starts a chain, calls run (which sets up whatever else the
// package needs and returns m.Run()'s code), closes the chain and exits. An error from Start or
// from run's set-up counts as a missing dependency.
func Main(m *testing.M, opts devchain.Options, run func(c *devchain.Chain) (int, error)) {
	os.Exit(main(m, opts, run))
}

func main(_ *testing.M, opts devchain.Options, run func(c *devchain.Chain) (int, error)) int {
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
