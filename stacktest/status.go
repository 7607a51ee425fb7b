package stacktest

import (
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Status is the status service over db and the env's chain, reporting finality at depth.
func (e *Env) Status(db *postgres.DB, depth uint64) *status.Service {
	return e.StatusBy(db, facilitator.Finality{Depth: depth})
}

// StatusBy is the status service over db and the env's chain, reporting finality by rule.
func (e *Env) StatusBy(db *postgres.DB, rule facilitator.Finality) *status.Service {
	n := e.Network()
	n.Finality = rule
	return status.New(db, []status.Network{{Network: n, Head: e.Chain.RPC}}, nil)
}
