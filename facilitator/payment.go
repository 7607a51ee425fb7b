package facilitator

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"unicode/utf8"

	"github.com/ethereum/go-ethereum/common"
)

// Payment is a verify or settle request decoded into typed values, the same for v1 and v2, so
// that verify/ and settle/ never look at the wire generation except where the protocol differs.
type Payment struct {
	X402Version int
	// Scheme and Network are what the client chose: accepted.* (v2) or the payload's own (v1).
	Scheme  string
	Network string

	Requirements  Requirements
	Authorization Authorization
	// Signature is the signature exactly as sent, possibly ERC-6492 wrapped.
	Signature []byte
	// Payer is authorization.from exactly as sent: the official facilitator echoes it verbatim.
	Payer string
	// Permit2 is set when the payload has the Permit2 shape, which we do not serve.
	Permit2    bool
	Extensions map[string]json.RawMessage
	// Body is the request as received, kept with the settlement for audit.
	Body []byte
	// Resource is the URL of the resource the payment is for, as sent: paymentPayload.resource.url
	// (v2) or paymentRequirements.resource (v1); "" when absent. Nothing checks that it is the
	// route being served (only the merchant knows that): it is bound to a payment id, so that an id
	// paid for one resource does not replay for another.
	Resource string
	// PaymentID is the payment-identifier extension's id (v2 only), "" when none was sent.
	PaymentID string
	// IDScope scopes PaymentID: "" (global) until merchant API keys exist.
	IDScope string
	// KeyID is the id of the merchant API key the request came with, "" in open mode: the key's
	// gas budget is charged for the settlement.
	KeyID string
}

// Requirements is the resource server's requirement, typed.
type Requirements struct {
	Scheme            string
	Network           string
	Amount            *big.Int // v2 amount, v1 maxAmountRequired
	Asset             common.Address
	PayTo             common.Address
	MaxTimeoutSeconds int64
	// Name and Version are extra.name and extra.version, the token's EIP-712 domain; empty when absent.
	Name    string
	Version string
}

// Authorization is the signed EIP-3009 TransferWithAuthorization message.
type Authorization struct {
	From        common.Address
	To          common.Address
	Value       *big.Int
	ValidAfter  *big.Int
	ValidBefore *big.Int
	Nonce       [32]byte
}

// MaxBodyBytes bounds a verify or settle request body. Real requests are about 2 KiB; extensions
// can add some, never this much.
const MaxBodyBytes = 64 << 10

// DecodeRequest decodes a /verify or /settle body. Every failure is an EInvalid *Error carrying
// the x402 reason and a message that says what is wrong; nothing here touches the chain.
func DecodeRequest(body []byte) (*Payment, error) {
	if len(body) > MaxBodyBytes {
		return nil, Errorf(EInvalid, ReasonInvalidPayload, "request body is larger than %d bytes", MaxBodyBytes)
	}
	if p := decodeOnePass(body); p != nil {
		return p, nil
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, Errorf(EInvalid, ReasonInvalidPayload, "request body: %s", jsonProblem(err))
	}
	p, err := ParseRequest(req)
	if err != nil {
		return nil, err
	}
	p.Body = body
	return p, nil
}

// oneRequest is the whole body in one decode: each json.Unmarshal scans its input before it
// decodes, so decoding level by level (the body, then the payload, then its payload and the
// requirements) scanned the same bytes four times.
type oneRequest struct {
	PaymentPayload *struct {
		payloadUnion
		Payload *ExactEVMPayload `json:"payload"`
	} `json:"paymentPayload"`
	PaymentRequirements *requirementsUnion `json:"paymentRequirements"`
}

// requirementsUnion is PaymentRequirements and PaymentRequirementsV1 in one (see payloadUnion):
// v1's fields and v2's amount.
type requirementsUnion struct {
	PaymentRequirementsV1
	Amount string `json:"amount"`
}

// decodeOnePass is DecodeRequest's common case, a valid body, in one decode; nil leaves the body
// to the level-by-level decode, which also says what is wrong with a bad one. The two agree
// (FuzzDecodeOnePass) because they differ only where a level kept raw bytes (the body's two
// objects, the payload's payload), and there only when its key comes twice: raw bytes take the
// last, a struct merges both. oneKeyEach makes sure no such key can come twice.
func decodeOnePass(body []byte) *Payment {
	if !oneKeyEach(body) {
		return nil
	}
	var one oneRequest
	if err := json.Unmarshal(body, &one); err != nil {
		return nil
	}
	pp, pr := one.PaymentPayload, one.PaymentRequirements
	if pp == nil || pr == nil || pp.Payload == nil || pp.X402Version == nil {
		return nil
	}
	var p *Payment
	var err error
	switch *pp.X402Version {
	case 2:
		p, err = parseV2(Request{},
			&PaymentPayload{X402Version: 2, Resource: pp.Resource, Accepted: pp.Accepted, Extensions: pp.Extensions},
			&PaymentRequirements{Scheme: pr.Scheme, Network: pr.Network, Amount: pr.Amount, Asset: pr.Asset, PayTo: pr.PayTo, MaxTimeoutSeconds: pr.MaxTimeoutSeconds, Extra: pr.Extra},
			pp.Payload)
	case 1:
		p, err = parseV1(Request{},
			&PaymentPayloadV1{X402Version: 1, Scheme: pp.Scheme, Network: pp.Network},
			&pr.PaymentRequirementsV1,
			pp.Payload)
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	p.Body = body
	return p
}

// oneKeyEach reports whether body is ASCII without a backslash (so that a key is its bytes: no
// escapes, and no Unicode case folding, which encoding/json applies when it matches a key to a
// field) and names each of "paymentPayload", "paymentRequirements" and "payload", in any case,
// at most once as a quoted string anywhere.
func oneKeyEach(body []byte) bool {
	if bytes.IndexByte(body, '\\') >= 0 {
		return false
	}
	for _, c := range body {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	var counts [3]int
	for i := 0; ; i++ {
		j := bytes.IndexByte(body[i:], '"')
		if j < 0 {
			return true
		}
		i += j
		if i+1 >= len(body) || body[i+1]|0x20 != 'p' { // all three start with p
			continue
		}
		for k, key := range [...]string{`"paymentPayload"`, `"paymentRequirements"`, `"payload"`} {
			if len(body)-i >= len(key) && bytes.EqualFold(body[i:i+len(key)], []byte(key)) {
				if counts[k]++; counts[k] > 1 {
					return false
				}
			}
		}
	}
}

// ParseRequest types a decoded request, dispatching on paymentPayload.x402Version.
func ParseRequest(req Request) (*Payment, error) {
	if isNull(req.PaymentPayload) {
		return nil, Errorf(EInvalid, ReasonInvalidPayload, "paymentPayload is missing")
	}
	if isNull(req.PaymentRequirements) {
		return nil, Errorf(EInvalid, ReasonInvalidPaymentRequirements, "paymentRequirements is missing")
	}
	// One decode of the payload usually serves both the version dispatch and the version's own
	// fields (each json.Unmarshal scans its whole input first). The union has every field of both
	// generations, and a key matches the same field in it as in the generation's own struct, so
	// when it decodes without error its fields are what the separate decodes give. A value of the
	// wrong type in the other generation's field fails it: then the separate decodes run, as before,
	// and say what is wrong in the same words.
	var u payloadUnion
	if err := json.Unmarshal(req.PaymentPayload, &u); err == nil && u.X402Version != nil {
		switch *u.X402Version {
		case 2:
			return parseV2(req, &PaymentPayload{X402Version: 2, Resource: u.Resource, Accepted: u.Accepted, Payload: u.Payload, Extensions: u.Extensions}, nil, nil)
		case 1:
			return parseV1(req, &PaymentPayloadV1{X402Version: 1, Scheme: u.Scheme, Network: u.Network, Payload: u.Payload}, nil, nil)
		}
	}
	var head struct {
		X402Version *int `json:"x402Version"`
	}
	if err := json.Unmarshal(req.PaymentPayload, &head); err != nil {
		return nil, Errorf(EInvalid, ReasonInvalidPayload, "paymentPayload: %s", jsonProblem(err))
	}
	if head.X402Version == nil {
		return nil, Errorf(EInvalid, ReasonInvalidX402Version, "paymentPayload.x402Version is missing")
	}
	switch *head.X402Version {
	case 2:
		return parseV2(req, nil, nil, nil)
	case 1:
		return parseV1(req, nil, nil, nil)
	default:
		return nil, Errorf(EInvalid, ReasonInvalidX402Version, "paymentPayload.x402Version %d is not supported (1 or 2)", *head.X402Version)
	}
}

// payloadUnion is PaymentPayload and PaymentPayloadV1 in one (ParseRequest).
type payloadUnion struct {
	X402Version *int                       `json:"x402Version"`
	Resource    *ResourceInfo              `json:"resource,omitempty"`
	Accepted    PaymentRequirements        `json:"accepted"`
	Payload     json.RawMessage            `json:"payload"`
	Extensions  map[string]json.RawMessage `json:"extensions,omitempty"`
	Scheme      string                     `json:"scheme"`
	Network     string                     `json:"network"`
}

// parseV2 types a v2 request. pp, pr and ep are its payload, requirements and the payload's
// payload when already decoded (decodeOnePass), else nil: decoded from req.
func parseV2(req Request, pp *PaymentPayload, pr *PaymentRequirements, ep *ExactEVMPayload) (*Payment, error) {
	pp, pr, err := decodeLevels(req, pp, pr)
	if err != nil {
		return nil, err
	}
	reqs, err := parseRequirements(pr.Scheme, pr.Network, pr.Amount, "amount", pr.Asset, pr.PayTo, pr.MaxTimeoutSeconds, pr.Extra)
	if err != nil {
		return nil, err
	}
	p := &Payment{
		X402Version:  2,
		Scheme:       clip(pp.Accepted.Scheme), // echoed in answers; no longer value can match a served one
		Network:      clip(pp.Accepted.Network),
		Requirements: reqs,
		Extensions:   pp.Extensions,
	}
	if pp.Resource != nil {
		p.Resource = pp.Resource.URL
	}
	if err := parseExactPayload(p, pp.Payload, ep); err != nil {
		return nil, err
	}
	if err := parsePaymentID(p); err != nil {
		return nil, err
	}
	return p, nil
}

// decodeLevels decodes a generation's payload and requirements from req, each unless already
// decoded (non-nil).
func decodeLevels[P, R any](req Request, pp *P, pr *R) (*P, *R, error) {
	if pp == nil {
		pp = new(P)
		if err := json.Unmarshal(req.PaymentPayload, pp); err != nil {
			return nil, nil, Errorf(EInvalid, ReasonInvalidPayload, "paymentPayload: %s", jsonProblem(err))
		}
	}
	if pr == nil {
		pr = new(R)
		if err := json.Unmarshal(req.PaymentRequirements, pr); err != nil {
			return nil, nil, Errorf(EInvalid, ReasonInvalidPaymentRequirements, "paymentRequirements: %s", jsonProblem(err))
		}
	}
	return pp, pr, nil
}

// parseV1 types a v1 request, like parseV2.
func parseV1(req Request, pp *PaymentPayloadV1, pr *PaymentRequirementsV1, ep *ExactEVMPayload) (*Payment, error) {
	pp, pr, err := decodeLevels(req, pp, pr)
	if err != nil {
		return nil, err
	}
	reqs, err := parseRequirements(pr.Scheme, pr.Network, pr.MaxAmountRequired, "maxAmountRequired", pr.Asset, pr.PayTo, pr.MaxTimeoutSeconds, pr.Extra)
	if err != nil {
		return nil, err
	}
	p := &Payment{X402Version: 1, Scheme: clip(pp.Scheme), Network: clip(pp.Network), Requirements: reqs, Resource: pr.Resource}
	if err := parseExactPayload(p, pp.Payload, ep); err != nil {
		return nil, err
	}
	return p, nil
}

func parseRequirements(scheme, network, amount, amountField, asset, payTo string, maxTimeout int64, extra json.RawMessage) (Requirements, error) {
	bad := func(format string, args ...any) (Requirements, error) {
		return Requirements{}, Errorf(EInvalid, ReasonInvalidPaymentRequirements, "paymentRequirements."+format, args...)
	}
	r := Requirements{Scheme: scheme, Network: network, MaxTimeoutSeconds: maxTimeout}
	if scheme == "" {
		return bad("scheme is missing")
	}
	if network == "" {
		return bad("network is missing")
	}
	var ok bool
	if r.Amount, ok = parseUint256(amount); !ok {
		return bad("%s must be a decimal string of atomic units, got %q", amountField, clip(amount))
	}
	if r.Asset, ok = parseAddress(asset); !ok {
		return bad("asset must be a 0x-prefixed 20-byte hex address, got %q", clip(asset))
	}
	if r.PayTo, ok = parseAddress(payTo); !ok {
		return bad("payTo must be a 0x-prefixed 20-byte hex address, got %q", clip(payTo))
	}
	if !isNull(extra) {
		var domain map[string]json.RawMessage
		if err := json.Unmarshal(extra, &domain); err != nil {
			return bad("extra must be an object or null")
		}
		for key, dst := range map[string]*string{"name": &r.Name, "version": &r.Version} {
			raw, present := domain[key]
			if !present || isNull(raw) {
				continue
			}
			if s, ok := plainString(raw); ok {
				*dst = s
				continue
			}
			if err := json.Unmarshal(raw, dst); err != nil {
				return bad("extra.%s must be a string", key)
			}
		}
	}
	return r, nil
}

// parseExactPayload types the payload's payload: ep when already decoded, else raw.
func parseExactPayload(p *Payment, raw json.RawMessage, ep *ExactEVMPayload) error {
	bad := func(format string, args ...any) error {
		return Errorf(EInvalid, ReasonInvalidPayload, "paymentPayload.payload."+format, args...)
	}
	if ep == nil {
		if isNull(raw) {
			return Errorf(EInvalid, ReasonInvalidPayload, "paymentPayload.payload is missing")
		}
		ep = new(ExactEVMPayload)
		if err := json.Unmarshal(raw, ep); err != nil {
			return Errorf(EInvalid, ReasonInvalidPayload, "paymentPayload.payload: %s", jsonProblem(err))
		}
	}
	// The official facilitator picks Permit2 by the key's presence alone.
	if ep.Permit2Authorization != nil {
		p.Permit2 = true
		var owner struct {
			From string `json:"from"`
		}
		_ = json.Unmarshal(ep.Permit2Authorization, &owner) // only to echo the payer, as upstream does
		// Only an address is echoed: nothing else about a Permit2 payload is checked.
		if _, ok := parseAddress(owner.From); ok {
			p.Payer = owner.From
		}
		return nil
	}
	a := ep.Authorization
	if a == nil {
		return bad("authorization is missing")
	}
	p.Payer = a.From
	var ok bool
	if p.Authorization.From, ok = parseAddress(a.From); !ok {
		return bad("authorization.from must be a 0x-prefixed 20-byte hex address, got %q", clip(a.From))
	}
	if p.Authorization.To, ok = parseAddress(a.To); !ok {
		return bad("authorization.to must be a 0x-prefixed 20-byte hex address, got %q", clip(a.To))
	}
	for _, f := range []struct {
		name string
		in   string
		out  **big.Int
	}{
		{"value", a.Value, &p.Authorization.Value},
		{"validAfter", a.ValidAfter, &p.Authorization.ValidAfter},
		{"validBefore", a.ValidBefore, &p.Authorization.ValidBefore},
	} {
		if *f.out, ok = parseUint256(f.in); !ok {
			return bad("authorization.%s must be a decimal string of a uint256, got %q", f.name, clip(f.in))
		}
	}
	nonce, ok := parseHex(a.Nonce)
	if !ok || len(nonce) != 32 {
		return bad("authorization.nonce must be 0x-prefixed 32-byte hex, got %q", clip(a.Nonce))
	}
	copy(p.Authorization.Nonce[:], nonce)
	sig, ok := parseHex(ep.Signature)
	if !ok || len(sig) == 0 {
		return bad("signature must be 0x-prefixed hex, got %q", clip(ep.Signature))
	}
	p.Signature = sig
	return nil
}

var maxUint256 = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1))

// parseUint256 accepts what BigInt() accepts of a decimal string, minus signs and blanks.
func parseUint256(s string) (*big.Int, bool) {
	if s == "" || len(s) > 78 || strings.TrimLeft(s, "0123456789") != "" {
		return nil, false
	}
	n, ok := new(big.Int).SetString(s, 10)
	if !ok || n.Cmp(maxUint256) > 0 {
		return nil, false
	}
	return n, true
}

// parseAddress accepts any case: the official packages checksum what they get rather than
// insisting on it.
func parseAddress(s string) (common.Address, bool) {
	b, ok := parseHex(s)
	if !ok || len(b) != common.AddressLength {
		return common.Address{}, false
	}
	return common.BytesToAddress(b), true
}

func parseHex(s string) ([]byte, bool) {
	h, ok := strings.CutPrefix(s, "0x")
	if !ok {
		h, ok = strings.CutPrefix(s, "0X")
	}
	if !ok || len(h)%2 != 0 {
		return nil, false
	}
	b, err := hex.DecodeString(h)
	return b, err == nil
}

// plainString reads a JSON string with nothing to unescape ("USD Coin") without another pass
// of the decoder; raw comes from a decode that already checked it is valid JSON. Anything else
// (escapes, bytes that are not UTF-8, which the decoder replaces) is left to json.Unmarshal.
func plainString(raw json.RawMessage) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	for _, c := range in {
		if c == '\\' || c == '"' || c < 0x20 || c >= utf8.RuneSelf {
			return "", false
		}
	}
	return string(in), true
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// clip keeps echoed input short: messages are for humans and logs, not for reflecting payloads.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// jsonProblem describes a JSON error without echoing Go type names at the caller.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return "must be a JSON object, got JSON " + te.Value
		}
		return te.Field + " has the wrong type (got JSON " + te.Value + ")"
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "not valid JSON: " + se.Error()
	}
	return "not valid JSON"
}
