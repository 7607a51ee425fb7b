package settle

import (
	"context"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Store is the part of the ledger the engine needs. Errors: facilitator.ErrNotFound,
// facilitator.ErrDuplicate (the authorization has a row), facilitator.ErrNonceTaken (the signer's
// tx nonce has a row); anything else means the ledger is unavailable.
type Store interface {
	SettlementByKey(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error)
	SettlementByID(ctx context.Context, id int64) (*facilitator.Settlement, error)
	// InsertSettlement commits the row, its first signed transaction and the "signed" event at
	// once. It is the write before the broadcast. When the row's facilitator.Limits refuses it, nothing is
	// written and the error is a *facilitator.Error with code ELimited and a RetryAfter.
	InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error)
	// InsertSettlements commits several new settlements in one transaction, all or none (a group
	// commit: one round trip for a burst of settlements on one key). Its error is
	// InsertSettlement's for the first row that failed, except that a row its facilitator.Limits refuses makes
	// it write nothing and return facilitator.ErrGroupRefused (the caller then commits the rows one by one).
	InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error)
	// AddTx records a fee-bumped replacement (same tx nonce) before it is sent;
	// facilitator.ErrNotFound (nothing written) when the settlement is mined or final;
	// facilitator.ErrDuplicate when the transaction is recorded already (an earlier AddTx of it
	// committed and its answer was lost).
	AddTx(ctx context.Context, settlementID int64, tx facilitator.TxRecord) error
	// MoveNonce records a re-signed transaction with a new tx nonce (the old one was taken by a
	// transaction that is not ours) and makes txNonce the settlement's, before it is sent. The
	// earlier variants stay recorded and watched. Errors: facilitator.ErrNonceTaken (the signer's
	// txNonce has a row), facilitator.ErrNotFound (the settlement is mined or final: a failed one
	// still moves, to fill a nonce gap below the key's other transactions), facilitator.ErrDuplicate
	// (the transaction is recorded already: an earlier move of it committed and its answer was lost).
	MoveNonce(ctx context.Context, settlementID int64, txNonce uint64, tx facilitator.TxRecord) error
	// MoveBatch re-signs members of one batch whose tx nonce a transaction that is not ours took:
	// it moves the settlements (in the order of their slots) to txNonce in slots 0..n-1 and
	// records tx, the new batch's transaction, under the new slot 0, at once, before it is sent.
	// Errors: facilitator.ErrNonceTaken (txNonce has a row), facilitator.ErrNotFound (a member is
	// no longer signed or broadcast, or not of the others' batch; nothing written),
	// facilitator.ErrDuplicate (tx is recorded already).
	MoveBatch(ctx context.Context, settlementIDs []int64, txNonce uint64, tx facilitator.TxRecord) error
	MarkBroadcast(ctx context.Context, ids []int64) error
	// Resolve moves open settlements to their outcomes, at once, and returns the ids it moved; it
	// leaves alone any that is no longer open (someone else resolved it: read it again). A
	// resolution's Claim is recorded in the same write under ClaimDelivery's rules; claimed lists
	// the moved ids whose claim was recorded. An error says nothing of what was written (a claim
	// may have committed: it is released by its token).
	Resolve(ctx context.Context, rs []facilitator.Resolution) (moved, claimed []int64, err error)
	// Reopen moves a mined settlement back to broadcast when its block left the canonical chain;
	// facilitator.ErrNotFound when it is not mined in that block (any more).
	Reopen(ctx context.Context, m facilitator.MinedIn, detail string) error
	// MarkFinal moves mined settlements to final, each only while it is still in the block judged
	// final, and returns the ids it moved.
	MarkFinal(ctx context.Context, finals []facilitator.MinedIn) ([]int64, error)
	// ClaimDelivery records that a caller with API key keyID ("" in open mode) is being answered
	// success: true. A settlement's success belongs to the key that created it: the claim is made
	// only for that key ("" only for a settlement created in open mode). It returns false
	// when another caller already was answered success, the settlement did not succeed, or keyID is
	// not the settlement's key.
	// claim is the claim's own token: a claim whose write answered an error may have committed,
	// and ReleaseDelivery with the same token undoes exactly it, never another caller's.
	// A claim holds the success undecided for lease: it counts for good once ConfirmDeliveries
	// records its answer written; one unconfirmed when its lease ends (its process died between
	// the claim and the answer) is taken over by the next claim. While another caller's claim is
	// undecided the answer is facilitator.ErrClaimUndecided (nothing written).
	ClaimDelivery(ctx context.Context, id int64, keyID string, claim []byte, lease time.Duration) (bool, error)
	// ConfirmDeliveries makes each claim, whose answer was written to its caller, count for good,
	// in one statement. lapsed lists the ids whose claim was no longer that token's (its lease
	// ended and another claim took it over, or it was released): their success may have been
	// answered twice.
	ConfirmDeliveries(ctx context.Context, ds []facilitator.Delivery) (lapsed []int64, err error)
	// ReleaseDelivery undoes the claim made with token claim (nothing when the success was claimed
	// with another), whose answer could not be written or whose write's outcome is unknown.
	ReleaseDelivery(ctx context.Context, id int64, claim []byte) error
	// OpenSettlements lists the signer's settlements in signed, broadcast or mined state, with all
	// their transactions, in tx nonce order.
	OpenSettlements(ctx context.Context, network string, signer common.Address) ([]facilitator.OpenSettlement, error)
	// ClosedFrom lists the signer's settlements that ended in a failure (reverted, expired,
	// settled elsewhere, canceled) at a tx nonce of at least from, with all their transactions, in
	// tx nonce order: their nonces may be unused on chain, a gap the signer's later transactions
	// wait behind until the settlement's transaction (which can only revert now) fills it.
	ClosedFrom(ctx context.Context, network string, signer common.Address, from uint64) ([]facilitator.OpenSettlement, error)
	// NoncesHeld lists the tx nonces of at least from that the signer's settlements hold (in any
	// state), ascending.
	NoncesHeld(ctx context.Context, network string, signer common.Address, from uint64) ([]uint64, error)
	// AdoptSettlements records a mined transaction of one of our keys that the ledger lost (a
	// failover, a restore), all members or none, and returns their ids: a member with no row gets
	// one, mined and marked adopted; an open row takes the transaction and is resolved mined (at
	// the transaction's key, nonce and slot, or where it is when another settlement holds that
	// place and a.MayStay); a row already mined by it is left alone; a row resolved settled
	// elsewhere by it (a writer that did not know every key took it for another's) is corrected
	// as an open row is. fresh reports that the call wrote a member (false: all were adopted already, by a
	// concurrent or earlier call): an adoption is counted once. facilitator.ErrDuplicate: a
	// member's row is resolved otherwise; facilitator.ErrNonceTaken: another settlement holds the
	// (signer, tx nonce, slot) of a new member, or of an open one without a.MayStay.
	AdoptSettlements(ctx context.Context, a facilitator.Adoption) (ids []int64, fresh bool, err error)
	// BindAdopted gives an adopted row that no request made (zero fingerprint) the request now
	// asking for it; false when the row is not such a row (any more).
	BindAdopted(ctx context.Context, id int64, fp facilitator.Fingerprint, keyID string, x402Version int, request []byte) (bool, error)
	// WalletCapWait is how long until a settlement of value by payer would fit g's wallet caps
	// (0: it fits now), read without a lock.
	WalletCapWait(ctx context.Context, network string, asset, payer common.Address, value *big.Int, g facilitator.Limits) (time.Duration, error)
}
