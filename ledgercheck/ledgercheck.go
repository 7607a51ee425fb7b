// Package ledgercheck holds the ledger-against-chain verdict for one settlement: what the ledger's
// row says (mined or final, by this transaction, in this block) against what the chain shows (the
// transaction's receipt and the token's authorizationState). It is the one rule that both the
// demo's closing table and the operations overview apply; how the evidence is read is theirs.
package ledgercheck

import (
	"fmt"

	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Verdict is what a check concludes.
type Verdict string

const (
	// Agrees: the receipt succeeded, carries the authorization's AuthorizationUsed log from the
	// token, and authorizationState says used at the receipt's block.
	Agrees Verdict = "agrees"
	// Disagrees: the chain, read at or above the receipt's block, contradicts the ledger.
	Disagrees Verdict = "disagrees"
	// Unreadable: the evidence is missing (a read failed, the node is behind, the receipt is not
	// there yet): nothing is concluded (invariant 8).
	Unreadable Verdict = "unreadable"
)

// Evidence is what was read of the chain for one settlement.
type Evidence struct {
	// Receipt is the ledger's transaction's receipt; nil when it could not be read.
	Receipt *types.Receipt
	// Used is authorizationState(payer, nonce), read pinned at the receipt's block (or later);
	// UsedKnown is false when that read failed.
	Used, UsedKnown bool
}

// Check compares a mined or final ledger row with the chain's evidence. problems says what
// disagrees (empty unless the verdict is Disagrees), or why nothing could be concluded.
func Check(row facilitator.Settlement, ev Evidence) (Verdict, []string) {
	if !row.State.Succeeded() {
		return Disagrees, []string{fmt.Sprintf("the ledger row is %s, want mined or final", row.State)}
	}
	if ev.Receipt == nil || !ev.UsedKnown {
		return Unreadable, []string{"the chain could not be read at the receipt's block"}
	}
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	r := ev.Receipt
	check(r.TxHash == row.TxHash, "the ledger's transaction %s is not the receipt's %s", row.TxHash.Hex(), r.TxHash.Hex())
	check(r.Status == types.ReceiptStatusSuccessful, "the receipt's status is %d, want 1", r.Status)
	// The one reading of a receipt for an authorization, the engine's and reconcile's too.
	switch e, tr := eip3009.EffectOf(r.Status == types.ReceiptStatusSuccessful, r.Logs, row.Key, row.PayTo, row.Value); e {
	case eip3009.NotUsed:
		check(r.Status != types.ReceiptStatusSuccessful, "the receipt carries no AuthorizationUsed(%s, %x) log of the token with its Transfer", row.Key.Payer.Hex(), row.Key.Nonce)
	case eip3009.PaidOther:
		check(false, "the authorization moved %s to %s; the ledger says %s to %s", tr.Value, tr.To.Hex(), row.Value, row.PayTo.Hex())
	}
	check(ev.Used, "authorizationState(payer, nonce) is false on chain")
	if r.BlockNumber != nil {
		check(row.BlockNumber == r.BlockNumber.Uint64(), "the ledger says block %d, the chain %d", row.BlockNumber, r.BlockNumber.Uint64())
	}
	if len(problems) > 0 {
		return Disagrees, problems
	}
	return Agrees, nil
}
