package settle_test

import (
	"testing"

	"github.com/x402-facilitator/x402-facilitator/settle/settletest"
)

// The package's tests share one anvil with real USDC and one database of their own.
var env *settletest.Env

func TestMain(m *testing.M) {
	settletest.Main(m, "settle", func(e *settletest.Env) int { env = e; return m.Run() })
}
