package settle

import (
	"context"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// CheckLimits tells, without reserving anything, whether a settlement of p would be refused by
// the wallet caps now: /verify asks, so that a merchant does not do work that /settle will refuse.
// Settle checks again, exactly, under a lock; this read is advice. The gas budget is not checked
// here (a settlement's gas cost is known only once it is signed), and an unreadable ledger lets
// the payment through: /settle has the last word.
func (e *Engine) CheckLimits(ctx context.Context, p *facilitator.Payment) error {
	g := e.cfg.Limits
	if !g.WalletCapped() || p.Authorization.Value == nil {
		return nil
	}
	id, err := e.verifier.Route(p)
	if err != nil {
		return nil // verification answers for a payment it cannot route
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	defer cancel()
	wait, err := e.store.WalletCapWait(ctx, id.ID, p.Requirements.Asset, p.Authorization.From, p.Authorization.Value, g)
	if err != nil {
		e.log.Warn("reading a wallet's usage for /verify; not checked", "network", id.ID, "payer", p.Authorization.From, "err", err)
		return nil
	}
	if wait > 0 {
		return facilitator.WalletCapExceeded(wait, g.WalletWindow)
	}
	return nil
}
