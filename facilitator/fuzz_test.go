package facilitator_test

import (
	"bytes"
	"encoding/json"
	"math/big"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Run one of these for a while with scripts/fuzz.sh (make fuzz); without -fuzz, go test runs their
// seeds as ordinary tests.

var (
	fuzzIDRE      = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	fuzzUintRE    = regexp.MustCompile(`^[0-9]{1,78}$`)
	fuzzAddressRE = regexp.MustCompile(`^0[xX][0-9a-fA-F]{40}$`)
	fuzzNonceRE   = regexp.MustCompile(`^0[xX][0-9a-fA-F]{64}$`)
	fuzzSigRE     = regexp.MustCompile(`^0[xX]([0-9a-fA-F]{2})+$`)
	fuzzMaxUint   = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1))
)

// fuzzJSONString is s as a decoder reads it back after encoding/json wrote it: invalid UTF-8
// becomes U+FFFD.
func fuzzJSONString(t testing.TB, s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// fuzzBaseline is validV2 decoded: what every field the fuzzer does not touch must decode to.
func fuzzBaseline(t testing.TB) *facilitator.Payment {
	p, err := facilitator.DecodeRequest([]byte(validV2))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// fuzzStrings collects every string in a decoded JSON value, keys included.
func fuzzStrings(v any, out map[string]bool) {
	switch v := v.(type) {
	case string:
		out[v] = true
	case []any:
		for _, e := range v {
			fuzzStrings(e, out)
		}
	case map[string]any:
		for k, e := range v {
			out[k] = true
			fuzzStrings(e, out)
		}
	}
}

// FuzzPaymentIdentifier: whatever sits under extensions["payment-identifier"], the request either
// decodes with no id or an id of the extension's alphabet that the client really sent, or fails
// with invalid_payment_identifier and a message; nothing else about the payment changes.
// raw is spliced in as is; id and required go through encoding/json, so for them the expected
// answer is known exactly.
func FuzzPaymentIdentifier(f *testing.F) {
	f.Add([]byte(`{"info":{"required":false,"id":"pay_0123456789abcdef"}}`), "pay_0123456789abcdef", false)
	f.Add([]byte(`{"info":{"required":true}}`), "", true)
	f.Add([]byte(`{"info":{"id":null,"required":true}}`), "short", false)
	f.Add([]byte(`{"info":{"id":12345678901234567890}}`), strings.Repeat("a", 128), true)
	f.Add([]byte(`{"info":{"id":"\u0070ay_0123456789abcdef"}}`), strings.Repeat("a", 129), false)
	f.Add([]byte(`{"info":[]}`), "pay_0123456789abcde\x00", true)
	f.Add([]byte(`{"INFO":{"ID":"pay_0123456789abcdef","Required":true}}`), "pay_0123456789abcd\xff", false)
	f.Add([]byte(`{"info":{"id":"pay_0123456789abcdef"},"info":null}`), "pay-0123456789ABCDEF_", true)
	f.Add([]byte(`null`), "", false)
	f.Add([]byte(`"pay_0123456789abcdef"`), "pay_0123456789abcdef\n", false)
	base := fuzzBaseline(f)
	f.Fuzz(func(t *testing.T, raw []byte, id string, required bool) {
		check := func(body []byte) (*facilitator.Payment, error) {
			p, err := facilitator.DecodeRequest(body)
			if len(body) > facilitator.MaxBodyBytes {
				if err == nil {
					t.Fatalf("accepted a %d-byte body", len(body))
				}
				return nil, err
			}
			if err != nil {
				if facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") != facilitator.ReasonInvalidPaymentIdentifier ||
					facilitator.ErrorMessage(err) == "" {
					t.Fatalf("an extension-only change failed otherwise than invalid_payment_identifier: %v", err)
				}
				return nil, err
			}
			if p.PaymentID != "" && !fuzzIDRE.MatchString(p.PaymentID) {
				t.Fatalf("accepted payment id %q", p.PaymentID)
			}
			// Everything but the extensions is what the baseline decodes to.
			got, want := *p, *base
			got.Extensions, got.Body, got.PaymentID = nil, nil, ""
			want.Extensions, want.Body = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("the extension changed the payment: %+v", got)
			}
			return p, nil
		}
		splice := func(ext []byte) []byte {
			body := strings.Replace(validV2, `"extensions":{}`, `"extensions":{"`+facilitator.PaymentIdentifierKey+`":`+string(ext)+`}`, 1)
			return []byte(body)
		}

		// Raw: only well-formed JSON values are spliced, so the body stays valid JSON.
		if json.Valid(raw) {
			if p, err := check(splice(raw)); err == nil && p != nil && p.PaymentID != "" {
				var v any
				if err := json.Unmarshal(raw, &v); err != nil {
					t.Fatal(err)
				}
				sent := map[string]bool{}
				fuzzStrings(v, sent)
				if !sent[p.PaymentID] {
					t.Fatalf("payment id %q is not a string of %s", p.PaymentID, raw)
				}
			}
		}

		// Structured: the answer is known exactly.
		ext := map[string]any{"info": map[string]any{"id": id, "required": required}}
		b, err := json.Marshal(ext)
		if err != nil {
			t.Fatal(err)
		}
		body := splice(b)
		if len(body) > facilitator.MaxBodyBytes {
			return
		}
		p, err := check(body)
		want := fuzzJSONString(t, id)
		switch {
		case fuzzIDRE.MatchString(want) && err != nil:
			t.Fatalf("id %q refused: %v", want, err)
		case !fuzzIDRE.MatchString(want) && err == nil:
			t.Fatalf("id %q accepted as %q", want, p.PaymentID)
		case err == nil && p.PaymentID != want:
			t.Fatalf("id %q decoded as %q", want, p.PaymentID)
		}
		// Without an id, required decides.
		b, _ = json.Marshal(map[string]any{"info": map[string]any{"required": required}})
		if p, err := check(splice(b)); (err == nil) == required || (err == nil && p.PaymentID != "") {
			t.Fatalf("no id, required %v: %v", required, err)
		}
	})
}

// FuzzDecodeFields: the decimal, address and hex fields of a request are accepted exactly when
// they have the documented form (decimal digits up to 2^256-1; 0x and 40 hex digits, any case;
// 0x and 64 hex digits; 0x and whole bytes of hex), decode to the value written, and a refusal
// names the first bad field with the reason of its half of the request.
func FuzzDecodeFields(f *testing.F) {
	f.Add("10000", "10000", "0", "4102444800", "0x"+strings.Repeat("5a", 32), "0x"+strings.Repeat("ab", 65), "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8")
	f.Add("0010000", "1e4", "-0", "0x10", strings.Repeat("5a", 32), "0x"+strings.Repeat("a", 131), "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", "0X70997970C51812DC3A010C7D01B50E0D17DC79C8")
	f.Add(fuzzMaxUint.String(), new(big.Int).Add(fuzzMaxUint, big.NewInt(1)).String(), " 1", "1.0", "0x"+strings.Repeat("5a", 31), "0x", "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8\x00")
	f.Add("٣", "+1", "", "00000000000000000000000000000000000000000000000000000000000000000000000000000001", "0x"+strings.Repeat("5a", 33), "0xzz", "3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "0x70997970C51812dc3A010C7d01b50e0d17dc79C\xff")
	f.Fuzz(func(t *testing.T, amount, value, validAfter, validBefore, nonce, signature, payTo, from string) {
		var m map[string]any
		if err := json.Unmarshal([]byte(validV2), &m); err != nil {
			t.Fatal(err)
		}
		reqs := m["paymentRequirements"].(map[string]any)
		payload := m["paymentPayload"].(map[string]any)["payload"].(map[string]any)
		auth := payload["authorization"].(map[string]any)
		reqs["amount"], reqs["payTo"] = amount, payTo
		auth["value"], auth["validAfter"], auth["validBefore"], auth["nonce"], auth["from"] = value, validAfter, validBefore, nonce, from
		payload["signature"] = signature
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		p, err := facilitator.DecodeRequest(body)
		if len(body) > facilitator.MaxBodyBytes {
			if err == nil {
				t.Fatalf("accepted a %d-byte body", len(body))
			}
			return
		}

		uintOK := func(s string) bool {
			if !fuzzUintRE.MatchString(s) {
				return false
			}
			n, _ := new(big.Int).SetString(s, 10)
			return n.Cmp(fuzzMaxUint) <= 0
		}
		// The fields in the order the decoder reads them, as it reads them.
		type field struct {
			name, in, reason string
			ok               bool
		}
		s := func(v string) string { return fuzzJSONString(t, v) }
		reqsReason, payloadReason := facilitator.ReasonInvalidPaymentRequirements, facilitator.ReasonInvalidPayload
		fields := []field{
			{"amount", s(amount), reqsReason, uintOK(s(amount))},
			{"payTo", s(payTo), reqsReason, fuzzAddressRE.MatchString(s(payTo))},
			{"from", s(from), payloadReason, fuzzAddressRE.MatchString(s(from))},
			{"value", s(value), payloadReason, uintOK(s(value))},
			{"validAfter", s(validAfter), payloadReason, uintOK(s(validAfter))},
			{"validBefore", s(validBefore), payloadReason, uintOK(s(validBefore))},
			{"nonce", s(nonce), payloadReason, fuzzNonceRE.MatchString(s(nonce))},
			{"signature", s(signature), payloadReason, fuzzSigRE.MatchString(s(signature))},
		}
		for _, fd := range fields {
			if fd.ok {
				continue
			}
			if err == nil {
				t.Fatalf("%s %q accepted", fd.name, fd.in)
			}
			if facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") != fd.reason ||
				!strings.Contains(facilitator.ErrorMessage(err), fd.name) {
				t.Fatalf("%s %q: got %v, want %s naming %s", fd.name, fd.in, err, fd.reason, fd.name)
			}
			return
		}
		if err != nil {
			t.Fatalf("every field well-formed, got %v", err)
		}
		dec := func(v string) string { n, _ := new(big.Int).SetString(v, 10); return n.String() }
		if p.Requirements.Amount.String() != dec(amount) || p.Authorization.Value.String() != dec(value) ||
			p.Authorization.ValidAfter.String() != dec(validAfter) || p.Authorization.ValidBefore.String() != dec(validBefore) {
			t.Fatalf("numbers decoded as %s %s %s %s", p.Requirements.Amount, p.Authorization.Value, p.Authorization.ValidAfter, p.Authorization.ValidBefore)
		}
		if p.Requirements.PayTo != common.HexToAddress(payTo) || p.Authorization.From != common.HexToAddress(from) || p.Payer != from {
			t.Fatalf("addresses decoded as %s %s (payer %q)", p.Requirements.PayTo, p.Authorization.From, p.Payer)
		}
		if !strings.EqualFold(common.Bytes2Hex(p.Authorization.Nonce[:]), nonce[2:]) || !strings.EqualFold(common.Bytes2Hex(p.Signature), signature[2:]) {
			t.Fatalf("hex decoded as %x %x", p.Authorization.Nonce, p.Signature)
		}
		if !bytes.Equal(p.Body, body) {
			t.Fatal("Body is not the request as received")
		}
	})
}
