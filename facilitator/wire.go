package facilitator

import "encoding/json"

// The x402 wire types, as the official packages (2.27, and x402 1.2.0 for v1) put them on the wire.
// Unknown fields are tolerated everywhere: newer clients add keys (extra.paymentFlow,
// resource.serviceName, extensions.*) that must not break an older facilitator.

// Request is the body of POST /verify and POST /settle. Payload and requirements stay raw until
// the payload's own x402Version says which generation to decode them as: the official facilitator
// ignores the top-level field and so do we.
type Request struct {
	X402Version         json.RawMessage `json:"x402Version,omitempty"` // not read: any value is tolerated
	PaymentPayload      json.RawMessage `json:"paymentPayload"`
	PaymentRequirements json.RawMessage `json:"paymentRequirements"`
}

// PaymentRequirements is the v2 requirement the resource server matched against the client's
// accepted option.
type PaymentRequirements struct {
	Scheme            string          `json:"scheme"`
	Network           string          `json:"network"`
	Amount            string          `json:"amount"`
	Asset             string          `json:"asset"`
	PayTo             string          `json:"payTo"`
	MaxTimeoutSeconds int64           `json:"maxTimeoutSeconds"`
	Extra             json.RawMessage `json:"extra,omitempty"`
}

// ResourceInfo describes the paid resource (v2).
type ResourceInfo struct {
	URL         string   `json:"url"`
	Description string   `json:"description,omitempty"`
	MimeType    string   `json:"mimeType,omitempty"`
	ServiceName string   `json:"serviceName,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	IconURL     string   `json:"iconUrl,omitempty"`
}

// PaymentPayload is the v2 payload the client signed.
type PaymentPayload struct {
	X402Version int                        `json:"x402Version"`
	Resource    *ResourceInfo              `json:"resource,omitempty"`
	Accepted    PaymentRequirements        `json:"accepted"`
	Payload     json.RawMessage            `json:"payload"`
	Extensions  map[string]json.RawMessage `json:"extensions,omitempty"`
}

// PaymentRequirementsV1 is the v1 requirement (x402 1.2.0).
type PaymentRequirementsV1 struct {
	Scheme            string          `json:"scheme"`
	Network           string          `json:"network"`
	MaxAmountRequired string          `json:"maxAmountRequired"`
	Resource          string          `json:"resource"`
	Description       string          `json:"description"`
	MimeType          string          `json:"mimeType"`
	OutputSchema      json.RawMessage `json:"outputSchema,omitempty"`
	PayTo             string          `json:"payTo"`
	MaxTimeoutSeconds int64           `json:"maxTimeoutSeconds"`
	Asset             string          `json:"asset"`
	Extra             json.RawMessage `json:"extra,omitempty"`
}

// PaymentPayloadV1 is the v1 payload: no accepted, resource or extensions.
type PaymentPayloadV1 struct {
	X402Version int             `json:"x402Version"`
	Scheme      string          `json:"scheme"`
	Network     string          `json:"network"`
	Payload     json.RawMessage `json:"payload"`
}

// ExactEVMPayload is the EIP-3009 variant of the exact scheme's payload. All numbers are decimal
// strings and the nonce is 0x-prefixed 32-byte hex.
type ExactEVMPayload struct {
	Signature     string                 `json:"signature"`
	Authorization *ExactEVMAuthorization `json:"authorization"`
	// Permit2Authorization is only looked at for its presence: the official facilitator picks the
	// transfer method by payload shape, and we do not settle Permit2.
	Permit2Authorization json.RawMessage `json:"permit2Authorization,omitempty"`
}

// ExactEVMAuthorization is the signed TransferWithAuthorization message, as sent.
type ExactEVMAuthorization struct {
	From        string `json:"from"`
	To          string `json:"to"`
	Value       string `json:"value"`
	ValidAfter  string `json:"validAfter"`
	ValidBefore string `json:"validBefore"`
	Nonce       string `json:"nonce"`
}

// VerifyResponse is the body of every /verify answer. isValid is always present; the official
// client accepts null for the rest.
type VerifyResponse struct {
	IsValid        bool           `json:"isValid"`
	InvalidReason  string         `json:"invalidReason,omitempty"`
	InvalidMessage string         `json:"invalidMessage,omitempty"`
	Payer          string         `json:"payer,omitempty"`
	Extensions     map[string]any `json:"extensions,omitempty"`
	Extra          map[string]any `json:"extra,omitempty"`
}

// SettleResponse is the body of every /settle answer. transaction and network are required by the
// official client's schema even on failure: leaving either out makes its merchant middleware 502.
type SettleResponse struct {
	Success      bool           `json:"success"`
	ErrorReason  string         `json:"errorReason,omitempty"`
	ErrorMessage string         `json:"errorMessage,omitempty"`
	Payer        string         `json:"payer,omitempty"`
	Transaction  string         `json:"transaction"`
	Network      string         `json:"network"`
	Extensions   map[string]any `json:"extensions,omitempty"`
	Extra        map[string]any `json:"extra,omitempty"`
}

// SupportedKind is one (version, scheme, network) triple the facilitator serves. The official
// resource server looks kinds up by string equality on network, so networks are always concrete.
type SupportedKind struct {
	X402Version int            `json:"x402Version"`
	Scheme      string         `json:"scheme"`
	Network     string         `json:"network"`
	Extra       map[string]any `json:"extra,omitempty"`
}

// SupportedResponse is the body of GET /supported.
type SupportedResponse struct {
	Kinds      []SupportedKind     `json:"kinds"`
	Extensions []string            `json:"extensions"`
	Signers    map[string][]string `json:"signers"`
}
