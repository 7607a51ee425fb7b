package facilitator

import (
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// State is where a settlement is in its life (ARCHITECTURE.md, "A settlement's life"). Verification
// failures leave no row: nothing was broadcast, and the same authorization may be tried again.
type State string

const (
	// StateSigned: the row and the signed raw transaction are committed; it may not have left the process.
	StateSigned State = "signed"
	// StateBroadcast: a node accepted the transaction (or already knew it).
	StateBroadcast State = "broadcast"
	// StateMined: a receipt with status 1 and the expected Transfer log.
	StateMined State = "mined"
	// StateFinal: mined and as deep as the network's finality depth.
	StateFinal State = "final"
	// StateReverted: our transaction was mined with status 0 and the authorization is unused.
	StateReverted State = "reverted"
	// StateExpired: validBefore passed with the authorization unused and nothing of ours can land.
	StateExpired State = "expired"
	// StateSettledElsewhere: the authorization was used by a transaction that is not ours.
	StateSettledElsewhere State = "settled_elsewhere"
	// StateCanceled: the authorizer canceled the authorization on chain before ours landed.
	StateCanceled State = "canceled"
)

// Open reports whether the engine still owes this settlement an outcome.
func (s State) Open() bool { return s == StateSigned || s == StateBroadcast }

// Succeeded reports whether the transfer happened through our transaction.
func (s State) Succeeded() bool { return s == StateMined || s == StateFinal }

// AuthorizationKey identifies an EIP-3009 authorization: nonces are unique per authorizer and
// token, not globally.
type AuthorizationKey struct {
	Network string
	Asset   common.Address
	Payer   common.Address
	Nonce   [32]byte
}

// Settlement is a ledger row.
type Settlement struct {
	ID           int64
	Key          AuthorizationKey
	Fingerprint  Fingerprint
	PayTo        common.Address
	Value        *big.Int
	ValidBefore  *big.Int
	Signer       common.Address
	TxNonce      uint64
	BatchSlot    int // the place in a batch transaction (0: lone, or the batch's first)
	State        State
	TxHash       common.Hash // the mined variant once known, else the latest sent
	BlockNumber  uint64
	BlockHash    common.Hash // the mined block's hash, zero while nothing is mined
	ErrorReason  string
	ErrorMessage string
	Delivered    bool // a caller has been answered success: true (or is, its claim undecided)
	// ClaimTakeovers counts the claims of the success taken over from one whose lease ended
	// unconfirmed (its process died before its answer was written, or just after: then two
	// callers were told success). It bounds the successes answered twice.
	ClaimTakeovers int
	// Adopted: the ledger recorded this settlement from the chain after it had lost the row
	// (Adoption), not before the broadcast.
	Adopted   bool
	CreatedAt time.Time
}

// SettleOutcome is the settlement service's answer to a /settle: the x402 response, and whether it
// delivered the settlement's one success (invariant 4 of ARCHITECTURE.md).
type SettleOutcome struct {
	Response     SettleResponse
	SettlementID int64
	// Claimed: this answer is the settlement's success. If it cannot be written to the caller,
	// the service's ReleaseDelivery hands the success to the next caller instead.
	Claimed bool
	// Claim is the claim's token, for ReleaseDelivery: only this claim is ever given back.
	Claim []byte
	// ClaimBy is when the claim's lease could end (read on the service's clock): a success not
	// written to its caller by then may have gone to another caller, and is not written at all.
	// The service's ConfirmDelivery, once the answer was written, makes the claim count for good.
	ClaimBy time.Time
}
