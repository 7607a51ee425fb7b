package stacktest

import (
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Status is the status service over db and the env's chain, reporting finality at depth.
func (e *Env) Status(db *postgres.DB, depth uint64) *status.Service {
	return status.New(db, []status.Network{{Network: e.Network(), Reader: e.Reader(), Head: e.Chain.RPC, FinalityDepth: depth}}, nil)
}
