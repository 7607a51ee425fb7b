package facilitator_test

import (
	"encoding/hex"
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
// ignore JSON spelling and change with what the payment asks. The id fingerprint, what an id is
// bound to, is the fingerprint plus the resource: another resource changes it, and nothing else
// that the fingerprint ignores does.
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
	if a.IDFingerprint() != none.IDFingerprint() || none.IDFingerprint() == none.Fingerprint() {
		t.Fatal("the id fingerprint depends on the id, or is the bare fingerprint")
	}
	// Spelling: lower-case payTo is the same payment for the same resource.
	lower := strings.Replace(validV2, `"payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2","assetTransferMethod"`,
		`"payTo":"0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2","assetTransferMethod"`, 1)
	if lower == validV2 {
		t.Fatal("test edit did not apply")
	}
	if p := decode([]byte(lower)); p.Fingerprint() != none.Fingerprint() || p.IDFingerprint() != none.IDFingerprint() {
		t.Fatal("address case changes a fingerprint")
	}
	// Another resource: the same payment (the settlement's fingerprint), not the same id binding.
	elsewhere := strings.Replace(validV2, `"url":"http://x/y"`, `"url":"http://elsewhere/z"`, 1)
	if elsewhere == validV2 {
		t.Fatal("test edit did not apply")
	}
	moved := decode([]byte(elsewhere))
	if moved.Resource != "http://elsewhere/z" || none.Resource != "http://x/y" {
		t.Fatalf("resources %q and %q, want the paymentPayload.resource.url sent", moved.Resource, none.Resource)
	}
	if moved.Fingerprint() != none.Fingerprint() {
		t.Fatal("the resource changes the settlement's fingerprint")
	}
	if moved.IDFingerprint() == none.IDFingerprint() {
		t.Fatal("another resource has the same id fingerprint")
	}
	if d := summaryDiff(none.Summary(), moved.Summary()); len(d) != 1 || d[0] != "resource" {
		t.Fatalf("summaries differ in %v, want [resource]", d)
	}
	amount := strings.Replace(validV2, `"amount":"10000","asset":"0x036cbd`, `"amount":"10001","asset":"0x036cbd`, 1)
	if amount == validV2 {
		t.Fatal("test edit did not apply")
	}
	other := decode([]byte(amount))
	if other.Fingerprint() == none.Fingerprint() {
		t.Fatal("a different amount has the same fingerprint")
	}
	if other.IDFingerprint() == none.IDFingerprint() {
		t.Fatal("a different amount has the same id fingerprint")
	}
	s1 := none.Summary()
	if d := summaryDiff(s1, other.Summary()); len(d) != 1 || d[0] != "amount" {
		t.Fatalf("summaries differ in %v, want [amount]", d)
	}
	for _, k := range []string{"scheme", "network", "asset", "amount", "payTo", "from", "to", "value", "validAfter", "validBefore", "nonce", "signature", "x402Version", "resource"} {
		if s1[k] == "" {
			t.Fatalf("summary lacks %q: %v", k, s1)
		}
	}
}

func summaryDiff(a, b map[string]string) []string {
	var differs []string
	for k, v := range a {
		if b[k] != v {
			differs = append(differs, k)
		}
	}
	return differs
}

// TestFingerprintPinned: both fingerprints are stored in the ledger (settlements and payment ids),
// so the values for a known request are pinned: a change of either formula orphans the rows made
// before it (an in-flight settlement's retry would be taken for someone else's request, an id's
// retry for a conflict), and needs a new version accepted beside the old one. The id fingerprint's
// value is new with it; the settlement fingerprint's is the one it always had.
func TestFingerprintPinned(t *testing.T) {
	v2, err := facilitator.DecodeRequest([]byte(validV2))
	if err != nil {
		t.Fatal(err)
	}
	v1, err := facilitator.DecodeRequest([]byte(validV1))
	if err != nil {
		t.Fatal(err)
	}
	if v1.Resource != "http://x/y" {
		t.Fatalf("v1 resource %q, want paymentRequirements.resource", v1.Resource)
	}
	for _, tc := range []struct {
		name string
		got  facilitator.Fingerprint
		want string
	}{
		{"v2 fingerprint", v2.Fingerprint(), "0x8d7dbf214373bf5faf1b4c07fb6cf14a49f561cd2b720cdc3f859394b293157a"},
		{"v2 id fingerprint", v2.IDFingerprint(), "0x569911e0a29be23bdf912716277a22504b9e6cb9bcb34fb863edf2bd5442af34"},
		{"v1 fingerprint", v1.Fingerprint(), "0x6cefb507331ebef368426b2eb0384bce44644f897b140955072febbfda162448"},
		{"v1 id fingerprint", v1.IDFingerprint(), "0x0b8b78190ab99bb7f26e3c6b9ff44cabdb711dce1e26b2914110ad2f6907a028"},
	} {
		if got := "0x" + hex.EncodeToString(tc.got[:]); got != tc.want {
			t.Errorf("%s = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestPaymentIDRecordBindsTo: a record binds the request whose id fingerprint it holds; one stored
// before ids covered the resource (the bare fingerprint, no resource in its summary) binds the
// payment for any resource; a bare fingerprint with a resource in the summary binds nothing.
func TestPaymentIDRecordBindsTo(t *testing.T) {
	p, err := facilitator.DecodeRequest([]byte(validV2))
	if err != nil {
		t.Fatal(err)
	}
	moved, err := facilitator.DecodeRequest([]byte(strings.Replace(validV2, `"url":"http://x/y"`, `"url":"http://elsewhere/z"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	legacySummary := p.Summary()
	delete(legacySummary, "resource")
	for _, tc := range []struct {
		name     string
		rec      facilitator.PaymentIDRecord
		p, moved bool
	}{
		{"bound now", facilitator.PaymentIDRecord{Fingerprint: p.IDFingerprint(), Summary: p.Summary()}, true, false},
		{"bound before the resource was", facilitator.PaymentIDRecord{Fingerprint: p.Fingerprint(), Summary: legacySummary}, true, true},
		{"bare fingerprint, resource in the summary", facilitator.PaymentIDRecord{Fingerprint: p.Fingerprint(), Summary: p.Summary()}, false, false},
	} {
		if got := tc.rec.BindsTo(p); got != tc.p {
			t.Errorf("%s: BindsTo(same resource) = %v, want %v", tc.name, got, tc.p)
		}
		if got := tc.rec.BindsTo(moved); got != tc.moved {
			t.Errorf("%s: BindsTo(another resource) = %v, want %v", tc.name, got, tc.moved)
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
