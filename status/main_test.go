package status_test

import (
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The package's tests share one anvil with real USDC and one database of their own, with one
// network id. They do not run in parallel: several switch the chain's mining off, and the index
// has one cursor per network.
var env *stacktest.Env

func TestMain(m *testing.M) {
	stacktest.Main(m, "status", func(e *stacktest.Env) int { env = e; return m.Run() })
}

// pendingDeadline is the engines' default deadline here: short, so that with mining off they
// answer settlement_pending soon.
const pendingDeadline = time.Second
