package postgres_test

import (
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// The DB is the store of every service that keeps state, and it imports none of them: these
// fail to build when a service's store and the adapter drift apart.
var (
	_ settle.Store  = (*postgres.DB)(nil)
	_ settle.Leaser = (*postgres.DB)(nil)
	_ indexer.Store = (*postgres.DB)(nil)
	_ notify.Store  = (*postgres.DB)(nil)
	_ auth.Store    = (*postgres.DB)(nil)
)
