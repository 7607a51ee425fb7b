package status

import (
	"context"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The public view (facilitator.Receipt) answers anyone who names an authorization, without an API
// key. Its rule: it tells what the chain tells, and of our own ledger only what our transaction
// has already told the chain's network. An authorization's key is known only to its payer, its
// merchant and us until it is used, but it may leak (a logged header), and a public answer must
// not turn a leaked or guessed key into news: that someone tried to pay whom, how much.
//
// So our ledger row counts only once our transaction has left us (publicLedger): broadcast (a node
// accepted it, and so did the mempool's readers, with its calldata: payer, payee, amount, nonce,
// validBefore) or mined. A row still only signed, or one whose transaction never got out (refused
// before any node took it, then expired; canceled by the payer first), is answered as if we had
// none: from the index (which holds the chain's own events) and the chain, found or not found
// exactly as for an authorization we never saw. What is then added beyond the chain is our own
// state of our own public transaction (pending, failed with our reason, the delivery record the
// merchant attached to it).

// Public answers the public view of an authorization. found is false when neither the chain's
// events in the index nor a ledger row that public may read know it (the answer is then the
// chain's word, as for any unknown nonce).
func (s *Service) Public(ctx context.Context, key facilitator.AuthorizationKey) (facilitator.Receipt, bool, error) {
	st, found, err := s.authorization(ctx, key, true)
	return facilitator.PublicReceipt(st), found, err
}

// PublicSettlement answers the public view by one of our transactions: not found unless it left us
// (publicLedger), exactly as for a hash that is not ours.
func (s *Service) PublicSettlement(ctx context.Context, tx common.Hash) (facilitator.Receipt, error) {
	st, err := s.settlement(ctx, tx, true)
	return facilitator.PublicReceipt(st), err
}

// publicLedger decides whether the public view may read our ledger row: only once its transaction
// has left us. sent says whether the row's events record a broadcast (a node accepted one of its
// transactions; a fee bump's event is written before its replacement is sent, so it is no proof).
// A mined or reverted row is on chain whatever its events say (a recovery may find the receipt of
// a transaction whose broadcast it never recorded).
func publicLedger(state facilitator.State, sent bool) bool {
	switch state {
	case facilitator.StateBroadcast, facilitator.StateMined, facilitator.StateFinal, facilitator.StateReverted:
		return true
	}
	return sent
}

// sentStates are the events that say a settlement's transaction reached a node.
var sentStates = []string{string(facilitator.StateBroadcast)}

// readable is the ledger row the answer may read: row itself for the full view, and for the
// public view row only when publicLedger says so (else nil: as if there were none).
func (s *Service) readable(ctx context.Context, row *facilitator.Settlement, public bool) (*facilitator.Settlement, error) {
	if !public || publicLedger(row.State, false) {
		return row, nil
	}
	evs, err := s.store.SettlementEvents(ctx, row.ID, 0, sentStates, 1)
	if err != nil {
		return nil, err
	}
	if publicLedger(row.State, len(evs) > 0) {
		return row, nil
	}
	return nil, nil
}
