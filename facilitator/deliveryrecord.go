package facilitator

import (
	"fmt"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
)

// DeliveryRecord is what a merchant says it served for a settled payment, recorded once by the API key
// that made the settlement: the SHA-256 of the response body, and optionally its content type and
// size. A payer holding the response can hash it and compare, proving which answer it paid for;
// the record is the merchant's word, shown beside (never instead of) what the chain shows.
type DeliveryRecord struct {
	// SHA256 is the response body's digest, 0x-prefixed lowercase hex (32 bytes).
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"contentType,omitempty"`
	Size        *int64    `json:"size,omitempty"`
	RecordedAt  time.Time `json:"recordedAt"`
}

// Same reports whether r and o record the same delivery: the same digest, content type and size
// (when each was recorded is not part of what was delivered).
func (r DeliveryRecord) Same(o DeliveryRecord) bool {
	sameSize := (r.Size == nil) == (o.Size == nil) && (r.Size == nil || *r.Size == *o.Size)
	return strings.EqualFold(r.SHA256, o.SHA256) && r.ContentType == o.ContentType && sameSize
}

// DeliveryAttachment asks to record what the merchant delivered for one settlement of a
// transaction (POST /v1/settlements/{tx}/delivery).
type DeliveryAttachment struct {
	// Tx is one of the settlement's transactions (any fee-bump variant).
	Tx common.Hash
	// Authorization names the settlement among a batch transaction's; nil: the transaction's only
	// one (a batch's transaction then needs it).
	Authorization *AuthorizationKey
	// KeyID is the API key the request is made with, "" in open mode: there anyone may attach,
	// since nobody there has a key to tell merchants apart.
	KeyID  string
	Record DeliveryRecord // RecordedAt is the ledger's to set
}

// DeliveryCandidate is one settlement of a transaction as the delivery rules read it.
type DeliveryCandidate struct {
	ID    int64
	Key   AuthorizationKey
	State State
	// KeyID is the API key the settlement was made with, "" for none (open mode).
	KeyID string
}

// Reasons of the delivery record's refusals (ours, additive).
const (
	// ReasonInvalidDelivery: the delivery body is not {"sha256": "0x…", …}, or names no settlement
	// of a batch's transaction where it must (HTTP 400).
	ReasonInvalidDelivery = "invalid_delivery"
	// ReasonNotSettlingKey: only the API key that made the settlement records what was delivered
	// for it (HTTP 403).
	ReasonNotSettlingKey = "not_settling_key"
	// ReasonSettlementNotSucceeded: the settlement failed (reverted, expired, canceled, or settled
	// by someone else): nothing was paid through it, so there is no delivery to record (HTTP 409).
	ReasonSettlementNotSucceeded = "settlement_not_succeeded"
	// ReasonDeliveryConflict: a different record is already kept for the settlement; it is never
	// replaced (HTTP 409).
	ReasonDeliveryConflict = "delivery_conflict"
)

// DeliveryTarget picks, among a transaction's settlements (members, in batch order: one for a
// lone settlement), the one a delivers for, and refuses it when a may not attach a record to it.
// The checks run in this order: which settlement (404 when the authorization is not one of them),
// whose (403), then whether it paid (409 settlement_pending while not mined, so the same request
// can be sent again once /settle answered; 409 settlement_not_succeeded when it failed).
func DeliveryTarget(members []DeliveryCandidate, a DeliveryAttachment) (DeliveryCandidate, error) {
	var m *DeliveryCandidate
	switch {
	case len(members) == 0:
		return DeliveryCandidate{}, &Error{Code: ENotFound, Reason: ReasonNotFound, Message: "no settlement of ours was made with this transaction", Err: ErrNotFound}
	case a.Authorization != nil:
		for i := range members {
			if members[i].Key == *a.Authorization {
				m = &members[i]
			}
		}
		if m == nil {
			return DeliveryCandidate{}, &Error{Code: ENotFound, Reason: ReasonNotFound,
				Message: "no settlement of this transaction is for that authorization", Err: ErrNotFound}
		}
	case len(members) > 1:
		return DeliveryCandidate{}, Errorf(EInvalid, ReasonInvalidDelivery,
			"the transaction settles %d authorizations: name one in authorization {network, asset, from, nonce}", len(members))
	default:
		m = &members[0]
	}
	if a.KeyID != "" && a.KeyID != m.KeyID {
		return DeliveryCandidate{}, Errorf(EForbidden, ReasonNotSettlingKey, "only the API key that made the settlement records what was delivered for it")
	}
	switch {
	case m.State.Succeeded():
		return *m, nil
	case m.State.Open():
		return DeliveryCandidate{}, Errorf(EConflict, ReasonSettlementPending, "the settlement is not mined yet: record the delivery once /settle answered success")
	}
	return DeliveryCandidate{}, Errorf(EConflict, ReasonSettlementNotSucceeded, "the settlement is %s: nothing was paid through it", m.State)
}

// DeliveryConflict refuses a record that differs from the one kept.
func DeliveryConflict(kept DeliveryRecord) error {
	return Errorf(EConflict, ReasonDeliveryConflict, "a different delivery (sha256 %s) is already recorded for this settlement; it is never replaced", kept.SHA256)
}

// DeliveryAnswer answers POST /v1/settlements/{tx}/delivery: the record as kept, and the
// authorization whose settlement carries it, with the path of its status.
type DeliveryAnswer struct {
	Network    string         `json:"network"`
	Asset      string         `json:"asset"`
	Authorizer string         `json:"authorizer"`
	Nonce      string         `json:"nonce"`
	Status     string         `json:"status"`
	Delivery   DeliveryRecord `json:"delivery"`
}

// NewDeliveryAnswer is the answer for the settlement of key, whose status path is status.
func NewDeliveryAnswer(key AuthorizationKey, status string, rec DeliveryRecord) DeliveryAnswer {
	return DeliveryAnswer{Network: key.Network, Asset: key.Asset.Hex(), Authorizer: key.Payer.Hex(),
		Nonce: hexutil.Encode(key.Nonce[:]), Status: status, Delivery: rec}
}

// DigestHex is a SHA-256 digest as a DeliveryRecord carries it.
func DigestHex(d [32]byte) string { return fmt.Sprintf("0x%x", d[:]) }

// DeliveryRequest is POST /v1/settlements/{tx}/delivery's body, as the client sends it and the API
// reads it.
type DeliveryRequest struct {
	SHA256        string                 `json:"sha256"`
	ContentType   string                 `json:"contentType,omitempty"`
	Size          *int64                 `json:"size,omitempty"`
	Authorization *DeliveryAuthorization `json:"authorization,omitempty"`
}

// DeliveryAuthorization names one authorization of a batch's transaction, as its status path does.
type DeliveryAuthorization struct {
	Network string `json:"network"`
	Asset   string `json:"asset"`
	From    string `json:"from"`
	Nonce   string `json:"nonce"`
}
