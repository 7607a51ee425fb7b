package facilitator

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
)

// PaymentIdentifierKey is the extension key of the payment-identifier extension (an x402 v2 extension).
const PaymentIdentifierKey = "payment-identifier"

// paymentIDPattern is the extension's id rule: 16 to 128 of [A-Za-z0-9_-].
var paymentIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)

// parsePaymentID reads extensions["payment-identifier"].info: the id the client attached, and
// whether the resource server declared the id required.
func parsePaymentID(p *Payment) error {
	raw, ok := p.Extensions[PaymentIdentifierKey]
	if !ok || isNull(raw) {
		return nil
	}
	var ext struct {
		Info *struct {
			Required *bool           `json:"required"`
			ID       json.RawMessage `json:"id"`
		} `json:"info"`
	}
	if err := json.Unmarshal(raw, &ext); err != nil || ext.Info == nil {
		return Errorf(EInvalid, ReasonInvalidPaymentIdentifier, "extensions.%s must be an object with an info object", PaymentIdentifierKey)
	}
	required := ext.Info.Required != nil && *ext.Info.Required
	if !isNull(ext.Info.ID) {
		var id string
		if err := json.Unmarshal(ext.Info.ID, &id); err != nil {
			return Errorf(EInvalid, ReasonInvalidPaymentIdentifier, "extensions.%s.info.id must be a string", PaymentIdentifierKey)
		}
		if !paymentIDPattern.MatchString(id) {
			return Errorf(EInvalid, ReasonInvalidPaymentIdentifier,
				"extensions.%s.info.id must be 16 to 128 characters of A-Z, a-z, 0-9, _ and -", PaymentIdentifierKey)
		}
		p.PaymentID = id
	}
	if required && p.PaymentID == "" {
		return Errorf(EInvalid, ReasonInvalidPaymentIdentifier, "the resource server requires a payment identifier (extensions.%s.info.id) and none was sent", PaymentIdentifierKey)
	}
	return nil
}

// Summary is the request's canonical fields by name (IDFingerprint's inputs), kept with a
// payment id so that a conflicting reuse can be logged with what differs.
func (p *Payment) Summary() map[string]string {
	r, a := p.Requirements, p.Authorization
	return map[string]string{
		"scheme": r.Scheme, "network": r.Network, "asset": r.Asset.Hex(), "amount": r.Amount.String(), "payTo": r.PayTo.Hex(),
		"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value.String(), "validAfter": a.ValidAfter.String(),
		"validBefore": a.ValidBefore.String(), "nonce": hexBytes(a.Nonce[:]), "signature": hexBytes(p.Signature),
		"x402Version": strconv.Itoa(p.X402Version), summaryResource: resourceSummary(p.Resource),
	}
}

// summaryResource is the Summary key of the resource; a summary without it was stored before ids
// were bound to the resource.
const summaryResource = "resource"

// resourceSummary keeps a long resource URL out of the summary, stored with every id, as its
// hash: the summary only has to show that it differs.
func resourceSummary(url string) string {
	if len(url) <= 256 {
		return url
	}
	return "keccak256:" + crypto.Keccak256Hash([]byte(url)).Hex()
}

// PaymentIDRecord is a payment id and what it is bound to.
type PaymentIDRecord struct {
	Scope string
	ID    string
	// Fingerprint is the request's IDFingerprint (its Fingerprint for ids bound before ids covered
	// the resource).
	Fingerprint Fingerprint
	Summary     map[string]string
	// Settlement is the settlement the id was first used for, as it stands now.
	Settlement *Settlement
	// Response is the stored answer, nil once compacted; it is current until ResponseExpires.
	Response        []byte
	ResponseExpires time.Time
	CreatedAt       time.Time
}

// BindsTo reports whether the id is bound to p: the same payment for the same resource. An id
// bound before ids covered the resource (its summary has none) stays bound to the payment alone:
// the retry of a request made before an upgrade must still get its answer, not a conflict.
func (r *PaymentIDRecord) BindsTo(p *Payment) bool {
	if r.Fingerprint == p.IDFingerprint() {
		return true
	}
	_, covered := r.Summary[summaryResource]
	return !covered && r.Fingerprint == p.Fingerprint()
}

// ErrPaymentIDTaken: the payment id is already bound to another request.
var ErrPaymentIDTaken = errors.New("payment identifier already bound to another request")

func hexBytes(b []byte) string { return "0x" + hex.EncodeToString(b) }

// ReplayInfo marks an answer given from an earlier request under the same payment id: the
// payment-identifier extension's response info, {"info": {"id": …, "replay": true}}.
func ReplayInfo(id string) map[string]any {
	return map[string]any{PaymentIdentifierKey: map[string]any{"info": map[string]any{"id": id, "replay": true}}}
}

// IsReplay reports whether an answer's extensions carry ReplayInfo.
func IsReplay(extensions map[string]any) bool {
	ext, _ := extensions[PaymentIdentifierKey].(map[string]any)
	info, _ := ext["info"].(map[string]any)
	replay, _ := info["replay"].(bool)
	return replay
}

// ReplayHeader is the HTTP header (ours, additive to x402) that marks an answer given from an
// earlier request under the same payment identifier. It is wire protocol, so it lives with the
// wire types: the server sets it, clients and load tools read it.
const ReplayHeader = "Payment-Identifier-Replay"
