package facilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// The ledger's rows for settlements: what the engine writes before it broadcasts, and what it
// reads back on recovery. They are domain types so that the adapter storing them
// (facilitator/postgres) and the engine writing them depend on the domain, not on each other.

// ErrGroupRefused is InsertSettlements' answer when a row's Limits refused it: nothing of the
// group was written. Each row's own insert (InsertSettlement) tells which, and why.
var ErrGroupRefused = errors.New("facilitator: a limit refused a row of the group; nothing was written")

// NewSettlement is a row to insert.
type NewSettlement struct {
	Key         AuthorizationKey
	Fingerprint Fingerprint
	PayTo       common.Address
	Value       *big.Int
	ValidAfter  *big.Int
	ValidBefore *big.Int
	X402Version int
	Request     []byte // JSON: {"paymentPayload":…,"paymentRequirements":…}
	Signer      common.Address
	TxNonce     uint64
	// BatchSlot is the settlement's place in a batch transaction (0: a lone settlement, or the
	// batch's first). Tx is the batch's transaction in every member; the ledger records it under
	// slot 0 only, and the others find it by (network, signer, tx nonce).
	BatchSlot int
	Tx        TxRecord
	// PaymentID, when set, is bound to this settlement in the same statement; an id already bound
	// makes the insert fail with ErrPaymentIDTaken and nothing is written.
	PaymentID *PaymentIDBinding
	// KeyID is the merchant API key the settlement was requested with ("" in open mode).
	KeyID string
	// GasReserved is the transaction's worst-case gas cost in wei: gas limit × max fee per gas.
	GasReserved *big.Int
	// Limits holds the bounds the row is checked against in the same transaction as its insert.
	Limits Limits
}

// Limits are the bounds a new settlement must fit. The store checks them against the ledger under
// a lock per wallet (and per key) taken in the insert's own transaction, so concurrent inserts
// from any number of processes see each other: the limits are exact.
type Limits struct {
	// WalletCapCount and WalletCapAmount bound the payer's settlements per network and asset
	// (signed, broadcast, mined or final) created within WalletWindow; 0 or nil: no bound.
	WalletCapCount  int
	WalletCapAmount *big.Int
	WalletWindow    time.Duration
	// KeyGasBudget is the gas budget (wei per rolling 24 hours) of a key with no budget of its
	// own; nil or 0: unlimited. Applies only when the row has a KeyID.
	KeyGasBudget *big.Int
}

// WalletCapped reports whether the limits bound wallets at all.
func (g Limits) WalletCapped() bool {
	return g.WalletWindow > 0 && (g.WalletCapCount > 0 || (g.WalletCapAmount != nil && g.WalletCapAmount.Sign() > 0))
}

// PaymentIDBinding is a payment-identifier id to bind to a new settlement.
type PaymentIDBinding struct {
	Scope string
	ID    string
	// Fingerprint is what the id is bound to: the payment's IDFingerprint (payment and resource),
	// not the settlement's own fingerprint.
	Fingerprint Fingerprint
	Summary     map[string]string
}

// TxRecord is one signed transaction of a settlement.
type TxRecord struct {
	Hash   common.Hash
	Raw    []byte
	TipCap *big.Int
	FeeCap *big.Int
	// Gas is the transaction's gas limit, when known (AddTx raises the settlement's reserved gas
	// cost to Gas × FeeCap); records read back from the ledger leave it 0.
	Gas uint64
}

// MinedIn names a mined settlement and the block it was judged in. A write that rests on that
// judgement (the block is final; the block left the chain) moves the row only while the ledger
// still has it in that block: another writer (the reconcile job, another replica) may have moved
// it to another block since, and a judgement of the old block says nothing of the new one.
type MinedIn struct {
	ID        int64
	BlockHash common.Hash
}

// Resolution is a settlement's outcome as read from the chain.
type Resolution struct {
	ID           int64
	State        State
	TxHash       common.Hash
	BlockNumber  uint64
	BlockHash    common.Hash
	ErrorReason  string
	ErrorMessage string
	// Claim, when set, is the success claimed in the same write for the caller waiting for this
	// outcome (invariant 4): recorded only under ClaimDelivery's rules (a mined outcome without an
	// error reason, no success delivered yet, the settlement's own API key), so that the waiting
	// caller's success costs no statement of its own.
	Claim *SuccessClaim
}

// SuccessClaim is a caller's claim of a settlement's one success: the caller's API key ("" in
// open mode) and the claim's own token, which releases exactly this claim and no other.
type SuccessClaim struct {
	KeyID string
	Token []byte
	// Lease is how long the claim holds the success undecided: it counts for good once
	// ConfirmDeliveries records its answer written, and a claim still unconfirmed when its lease
	// ends (its process died before the answer went out) goes to the next claim.
	Lease time.Duration
}

// Delivery is a success claim whose answer was written to its caller, to be confirmed.
type Delivery struct {
	ID    int64
	Claim []byte
}

// OpenSettlement is a settlement the engine still watches, with every transaction it signed.
type OpenSettlement struct {
	Settlement
	Txs []TxRecord
}

// WalletCapExceeded is the refusal of a settlement by the wallet caps of window; wait is when the
// same settlement would fit.
func WalletCapExceeded(wait, window time.Duration) error {
	return &Error{Code: ELimited, Reason: ReasonWalletCapExceeded, RetryAfter: wait,
		Message: fmt.Sprintf("the paying wallet has reached this facilitator's cap of settlements of this asset over %s; nothing was sent, retry after Retry-After", window)}
}

// GasBudgetExceeded is the refusal of a settlement by its API key's gas budget; wait is when the
// same settlement would fit.
func GasBudgetExceeded(wait time.Duration) error {
	return &Error{Code: ELimited, Reason: ReasonGasBudgetExceeded, RetryAfter: wait,
		Message: "this API key's gas budget for the last 24 hours would be exceeded by this settlement; nothing was sent, retry after Retry-After"}
}

// SignerLease is a held lease. Its writes are the key's ledger writes that allocate or extend its
// nonce stream: they go through the lease itself and fail once it is lost, so a process that lost a
// key cannot commit a transaction for it.
type SignerLease interface {
	// Lost is closed when the lease ends: its session failed, or Release.
	Lost() <-chan struct{}
	// Wanted reports whether another process queued for this lease at the last check.
	Wanted() bool
	InsertSettlement(ctx context.Context, s *NewSettlement) (int64, error)
	InsertSettlements(ctx context.Context, rows []*NewSettlement) ([]int64, error)
	AddTx(ctx context.Context, settlementID int64, tx TxRecord) error
	MoveNonce(ctx context.Context, settlementID int64, txNonce uint64, tx TxRecord) error
	// MoveBatch re-signs members of one batch as a new batch at txNonce (slots in the order of
	// ids), recording tx before it is sent.
	MoveBatch(ctx context.Context, settlementIDs []int64, txNonce uint64, tx TxRecord) error
	// Release gives the lease up. It is safe to call more than once.
	Release()
}

// Adoption is a mined transaction of one of a network's signer keys that the ledger lacks: the
// ledger lost its newest commits (an asynchronous standby promoted, a restore from a backup)
// while the chain kept what they recorded. Adopting it records the settlements it made, mined,
// so that no authorization of theirs is settled twice and every retry is told the truth.
type Adoption struct {
	Network     string
	Signer      common.Address
	TxNonce     uint64
	Tx          TxRecord
	BlockNumber uint64
	BlockHash   common.Hash
	// Members are the authorizations the transaction used, each at its place in the
	// transaction (a batch's slot; 0 for a lone transferWithAuthorization).
	Members []AdoptedMember
	// MayStay lets an open member's row whose transaction's place (signer, tx nonce, slot)
	// another settlement holds be resolved where it is, holding its own nonce: the caller saw
	// that nonce used in a block that stays. Without it such a member refuses the adoption
	// (ErrNonceTaken): a row resolved at a nonce nothing uses would hold a gap nothing fills,
	// every later transaction of its key waiting behind it.
	MayStay bool
}

// AdoptedMember is one authorization an adopted transaction used.
type AdoptedMember struct {
	Key         AuthorizationKey
	Slot        int
	PayTo       common.Address
	Value       *big.Int
	ValidAfter  *big.Int
	ValidBefore *big.Int
	// Fingerprint, KeyID, X402Version and Request are the request's, when a retry of it brought
	// the adoption about; zero otherwise (the request is unknown: the first request for the
	// authorization that matches its terms takes the row, BindAdopted).
	Fingerprint Fingerprint
	KeyID       string
	X402Version int
	Request     []byte
	// PaymentID, when the request carried one, is bound to the new row as an insert binds it
	// (an id bound already, to anything, is left as it is).
	PaymentID *PaymentIDBinding
}

// Has reports whether the adoption records the authorization of key.
func (a *Adoption) Has(key AuthorizationKey) bool {
	for _, m := range a.Members {
		if m.Key == key {
			return true
		}
	}
	return false
}
