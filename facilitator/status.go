package facilitator

// AuthorizationStatus answers "did authorization N settle?" (GET /v1/...). State is one of:
//
//	unused   the authorization has not been used on chain
//	pending  our settlement is broadcast (or about to be) and not mined: Transaction is its hash
//	settled  the authorization was used and its transfer is on chain; SettledBy says by whom
//	canceled the authorizer canceled it on chain
//	expired  validBefore passed with it unused: the only state in which a payer may sign again
//	failed   our transaction was mined and reverted; the authorization is still unused
//	used     used on chain, and not known yet whether by a transfer or a cancel (no log of its use
//	         was read: the index has not reached it); ask again
type AuthorizationStatus struct {
	State         string `json:"state"`
	Network       string `json:"network"`
	Asset         string `json:"asset"`
	Authorizer    string `json:"authorizer"`
	Nonce         string `json:"nonce"`
	Transaction   string `json:"transaction,omitempty"`
	BlockNumber   uint64 `json:"blockNumber,omitempty"`
	Confirmations uint64 `json:"confirmations,omitempty"`
	Final         bool   `json:"final"`
	// Finality is the rule Final was decided by, and where finality stood when read.
	Finality StatusFinality `json:"finality"`
	// SettledBy is "facilitator" when the transfer is ours, "other" when another party settled it.
	SettledBy   string `json:"settledBy,omitempty"`
	To          string `json:"to,omitempty"`
	Value       string `json:"value,omitempty"`
	ValidBefore string `json:"validBefore,omitempty"`
	PaymentID   string `json:"paymentId,omitempty"`
	// PaymentIDs are the payment-identifier ids that resolved to this authorization, as far as the
	// reading key may see them (its own; every key's for an operator key or in open mode). Never
	// in the public view.
	PaymentIDs []string `json:"paymentIds,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	// Basis says what the answer was read from: "ledger" (our settlements), "index" (indexed
	// chain events) or "chain" (a direct authorizationState read, when neither knows it).
	Basis string `json:"basis"`
	// IndexedHead is the last block the index had stored when this answer was read.
	IndexedHead uint64 `json:"indexedHead"`
	// Head is the chain's head at the time of reading.
	Head uint64 `json:"head"`
	// Batch lists every settlement of a batch's transaction, in the batch's order, when the answer
	// is by transaction and the transaction is a batch's (the answer's own fields are then its
	// first settlement's). Absent otherwise.
	Batch []BatchSettlement `json:"batch,omitempty"`
	// Delivery is what the settling merchant recorded it served for this payment (nil: nothing
	// recorded, or not ours).
	Delivery *DeliveryRecord `json:"delivery,omitempty"`
	// View is "public" on an answer given without an API key (Receipt); absent on the full view.
	View string `json:"view,omitempty"`
}

// BatchSettlement is one settlement of a batch's transaction, as the status by transaction lists it.
type BatchSettlement struct {
	Network    string `json:"network"`
	Asset      string `json:"asset"`
	Authorizer string `json:"authorizer"`
	Nonce      string `json:"nonce"`
	// State is the settlement's ledger state as a status state; its own status (Status) answers
	// in full, with what the index knows.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Status is the path of the settlement's own status answer.
	Status string `json:"status"`
}

// LedgerStatus is the status state of a settlement's ledger state.
func LedgerStatus(s State) string {
	switch s {
	case StateMined, StateFinal, StateSettledElsewhere:
		return StatusSettled
	case StateReverted:
		return StatusFailed
	case StateExpired:
		return StatusExpired
	case StateCanceled:
		return StatusCanceled
	}
	return StatusPending
}

// StatusFinality is the finality rule a status answer applied.
type StatusFinality struct {
	// Rule is "tag:finalized" or "tag:safe" (final at or below the block the node reports under
	// the tag), or "depth:<n>" (final n confirmations deep): a tag rule whose tag could not be
	// read says the depth it fell back to.
	Rule string `json:"rule"`
	// FinalBlock is the highest final block by the rule when read; absent (0) when none is known
	// (the node's answer could not be right, or the chain is shorter than the depth). A value,
	// not a pointer, so that two answers read alike compare equal; block 0, the genesis, holds
	// no transfer to be final.
	FinalBlock uint64 `json:"finalBlock,omitempty"`
}

// Status states.
const (
	StatusUnused   = "unused"
	StatusPending  = "pending"
	StatusSettled  = "settled"
	StatusCanceled = "canceled"
	StatusExpired  = "expired"
	StatusFailed   = "failed"
	StatusUsed     = "used"
)

// StatusAdvice says what a merchant or agent should do in each state (docs/api.md, "Status"): the CLI
// and the console both say it.
func StatusAdvice(state string) string {
	switch state {
	case StatusUnused:
		return "nothing has moved; it can still be settled until validBefore"
	case StatusPending:
		return "broadcast, not mined yet: wait and ask again; never sign a new authorization"
	case StatusSettled:
		return "the payment happened"
	case StatusCanceled:
		return "canceled by the payer: no payment"
	case StatusExpired:
		return "expired unused: the payer may safely sign a new authorization"
	case StatusFailed:
		return "our transaction reverted; nothing moved"
	case StatusUsed:
		return "used on chain, paid or canceled not known yet: do not serve and do not sign again; ask again"
	}
	return ""
}
