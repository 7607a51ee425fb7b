package ops_test

import (
	"testing"

	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The package's tests share one anvil with real USDC; each ledger test names a database of its own.
var env *stacktest.Env

func TestMain(m *testing.M) {
	stacktest.Main(m, "ops", func(e *stacktest.Env) int { env = e; return m.Run() })
}
