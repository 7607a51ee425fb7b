package facilitator_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// withExtension is validV2 with paymentPayload.extensions["payment-identifier"] set to ext (raw
// JSON); "" leaves the extensions object empty.
func withExtension(t *testing.T, ext string) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(validV2), &doc); err != nil {
		t.Fatal(err)
	}
	if ext != "" {
		var v any
		if err := json.Unmarshal([]byte(ext), &v); err != nil {
			t.Fatalf("test extension %s: %v", ext, err)
		}
		doc["paymentPayload"].(map[string]any)["extensions"] = map[string]any{facilitator.PaymentIdentifierKey: v}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPaymentIDDecode: the payment-identifier extension's id is read from
// paymentPayload.extensions; an id that breaks the extension's rule (16 to 128 of A-Za-z0-9_-),
// or a resource server's required id that is missing, is a 400 invalid_payment_identifier.
func TestPaymentIDDecode(t *testing.T) {
	long := strings.Repeat("a", 128)
	cases := []struct {
		name, ext string
		id        string // the id decoded, when valid
		reason    string // the 400 reason, when not
	}{
		{name: "no extension", ext: ""},
		{name: "extension null", ext: `null`},
		{name: "id, not required", ext: `{"info":{"required":false,"id":"pay_0123456789abcdef"}}`, id: "pay_0123456789abcdef"},
		{name: "id, required", ext: `{"info":{"required":true,"id":"pay_0123456789abcdef"}}`, id: "pay_0123456789abcdef"},
		{name: "id, required absent", ext: `{"info":{"id":"AbCdEf-_0123456789"}}`, id: "AbCdEf-_0123456789"},
		{name: "16 characters", ext: `{"info":{"id":"0123456789abcdef"}}`, id: "0123456789abcdef"},
		{name: "128 characters", ext: `{"info":{"id":"` + long + `"}}`, id: long},
		{name: "no id, not required", ext: `{"info":{"required":false}}`},
		{name: "id null, not required", ext: `{"info":{"required":false,"id":null}}`},
		{name: "unknown fields", ext: `{"info":{"required":false,"id":"pay_0123456789abcdef","x":1},"schema":{}}`, id: "pay_0123456789abcdef"},

		{name: "15 characters", ext: `{"info":{"id":"0123456789abcde"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "129 characters", ext: `{"info":{"id":"` + long + `b"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "empty id", ext: `{"info":{"id":""}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "space", ext: `{"info":{"id":"pay 0123456789abcdef"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "punctuation", ext: `{"info":{"id":"pay.0123456789abcdef"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "slash", ext: `{"info":{"id":"pay/0123456789abcdef"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "non-ASCII letter", ext: `{"info":{"id":"pay_0123456789abcdé"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "trailing newline", ext: `{"info":{"id":"pay_0123456789abcdef\n"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "id is a number", ext: `{"info":{"id":12345678901234567890}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "id is an object", ext: `{"info":{"id":{"v":"pay_0123456789abcdef"}}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "no info", ext: `{"id":"pay_0123456789abcdef"}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "info null", ext: `{"info":null}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "extension is a string", ext: `"pay_0123456789abcdef"`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "required, no id", ext: `{"info":{"required":true}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "required, id null", ext: `{"info":{"required":true,"id":null}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
		{name: "required, id too short", ext: `{"info":{"required":true,"id":"short"}}`, reason: facilitator.ReasonInvalidPaymentIdentifier},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := facilitator.DecodeRequest(withExtension(t, tc.ext))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("want a valid request, got %v", err)
				}
				if p.PaymentID != tc.id {
					t.Fatalf("PaymentID %q, want %q", p.PaymentID, tc.id)
				}
				if p.IDScope != "" {
					t.Fatalf("IDScope %q, want the global scope", p.IDScope)
				}
				return
			}
			if err == nil {
				t.Fatalf("want %s, decoded id %q", tc.reason, p.PaymentID)
			}
			if facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") != tc.reason {
				t.Fatalf("want EInvalid %s, got code %s reason %s (%v)", tc.reason, facilitator.ErrorCode(err), facilitator.ErrorReason(err, ""), err)
			}
			msg := facilitator.ErrorMessage(err)
			if !strings.Contains(msg, facilitator.PaymentIdentifierKey) {
				t.Fatalf("message %q does not name the extension", msg)
			}
			if len(msg) > 300 {
				t.Fatalf("a %d-byte message echoes too much input", len(msg))
			}
		})
	}
}

// TestPaymentIDFingerprint: the id is not part of the fingerprint (a retry under the same id is
// the same request, and the same payment under another id too); the fingerprint and the summary
// ignore JSON spelling and change with what the payment asks.
func TestPaymentIDFingerprint(t *testing.T) {
	decode := func(body []byte) *facilitator.Payment {
		t.Helper()
		p, err := facilitator.DecodeRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := decode(withExtension(t, `{"info":{"id":"pay_0123456789abcdef"}}`))
	b := decode(withExtension(t, `{"info":{"id":"pay_fedcba9876543210"}}`))
	none := decode(withExtension(t, ""))
	if a.Fingerprint() != b.Fingerprint() || a.Fingerprint() != none.Fingerprint() {
		t.Fatal("the payment id changes the fingerprint")
	}
	// Spelling: lower-case payTo, a resource of its own: the same payment.
	spelled := strings.Replace(validV2, `"payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2","assetTransferMethod"`,
		`"payTo":"0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2","assetTransferMethod"`, 1)
	spelled = strings.Replace(spelled, `"url":"http://x/y"`, `"url":"http://elsewhere/z"`, 1)
	if spelled == validV2 {
		t.Fatal("test edit did not apply")
	}
	if decode([]byte(spelled)).Fingerprint() != none.Fingerprint() {
		t.Fatal("address case or resource text changes the fingerprint")
	}
	amount := strings.Replace(validV2, `"amount":"10000","asset":"0x036cbd`, `"amount":"10001","asset":"0x036cbd`, 1)
	if amount == validV2 {
		t.Fatal("test edit did not apply")
	}
	other := decode([]byte(amount))
	if other.Fingerprint() == none.Fingerprint() {
		t.Fatal("a different amount has the same fingerprint")
	}
	s1, s2 := none.Summary(), other.Summary()
	var differs []string
	for k, v := range s1 {
		if s2[k] != v {
			differs = append(differs, k)
		}
	}
	if len(differs) != 1 || differs[0] != "amount" {
		t.Fatalf("summaries differ in %v, want [amount]", differs)
	}
	for _, k := range []string{"scheme", "network", "asset", "amount", "payTo", "from", "to", "value", "validAfter", "validBefore", "nonce", "signature", "x402Version"} {
		if s1[k] == "" {
			t.Fatalf("summary lacks %q: %v", k, s1)
		}
	}
}

// TestReplayInfo: the replay marker is the extension's response info, and IsReplay reads it back
// through JSON as a client would.
func TestReplayInfo(t *testing.T) {
	ext := facilitator.ReplayInfo("pay_0123456789abcdef")
	if !facilitator.IsReplay(ext) {
		t.Fatal("IsReplay(ReplayInfo) is false")
	}
	b, err := json.Marshal(ext)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"payment-identifier":{"info":{"id":"pay_0123456789abcdef","replay":true}}}` {
		t.Fatalf("replay info %s", b)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil || !facilitator.IsReplay(back) {
		t.Fatalf("IsReplay after a JSON round trip: %v %v", back, err)
	}
	for _, ext := range []map[string]any{nil, {}, {"payment-identifier": "x"}, {"payment-identifier": map[string]any{"info": map[string]any{"replay": false}}}} {
		if facilitator.IsReplay(ext) {
			t.Fatalf("IsReplay(%v) is true", ext)
		}
	}
}
