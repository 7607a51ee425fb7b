package facilitator_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const validV2 = `{"x402Version":2,"paymentPayload":{"x402Version":2,"payload":{"authorization":{"from":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","value":"10000","validAfter":"0","validBefore":"4102444800","nonce":"0x5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"},"signature":"0xabababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab1b"},"resource":{"url":"http://x/y","serviceName":"new field"},"accepted":{"scheme":"exact","network":"eip155:31337","amount":"10000","asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2"}},"extensions":{}},"paymentRequirements":{"scheme":"exact","network":"eip155:31337","amount":"10000","asset":"0x036cbd53842c5426634e7929541ec2318f3dcf7e","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2","assetTransferMethod":"eip3009"},"unknownField":true}}`

const validV1 = `{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"base-sepolia","payload":{"authorization":{"from":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","value":"10000","validAfter":"1700000000","validBefore":"4102444800","nonce":"0x5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"},"signature":"0x00"}},"paymentRequirements":{"scheme":"exact","network":"base-sepolia","maxAmountRequired":"10000","resource":"http://x/y","description":"","mimeType":"","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","extra":{"name":"USDC","version":"2"}}}`

func TestDecodeValid(t *testing.T) {
	p, err := facilitator.DecodeRequest([]byte(validV2))
	if err != nil {
		t.Fatal(err)
	}
	if p.X402Version != 2 || p.Scheme != "exact" || p.Network != "eip155:31337" || p.Requirements.Amount.Int64() != 10000 ||
		p.Requirements.Name != "USD Coin" || p.Requirements.Version != "2" || p.Authorization.ValidBefore.Int64() != 4102444800 ||
		p.Payer != "0x70997970C51812dc3A010C7d01b50e0d17dc79C8" || len(p.Signature) != 65 || p.Authorization.Nonce[0] != 0x5a {
		t.Fatalf("decoded %+v", p)
	}
	p, err = facilitator.DecodeRequest([]byte(validV1))
	if err != nil {
		t.Fatal(err)
	}
	if p.X402Version != 1 || p.Network != "base-sepolia" || p.Requirements.Amount.Int64() != 10000 || p.Requirements.Name != "USDC" {
		t.Fatalf("decoded %+v", p)
	}
}

// TestDecodeInvalid: every malformed request is an EInvalid error with the reason a client can act on.
func TestDecodeInvalid(t *testing.T) {
	edit := func(path string, value any) string {
		var doc map[string]any
		if err := json.Unmarshal([]byte(validV2), &doc); err != nil {
			t.Fatal(err)
		}
		keys := strings.Split(path, ".")
		m := doc
		for _, k := range keys[:len(keys)-1] {
			m = m[k].(map[string]any)
		}
		if value == nil {
			delete(m, keys[len(keys)-1])
		} else {
			m[keys[len(keys)-1]] = value
		}
		b, _ := json.Marshal(doc)
		return string(b)
	}
	cases := []struct {
		name, body, reason string
	}{
		{"empty", ``, facilitator.ReasonInvalidPayload},
		{"not JSON", `{"x402Version":2,`, facilitator.ReasonInvalidPayload},
		{"array", `[]`, facilitator.ReasonInvalidPayload},
		{"no payload", edit("paymentPayload", nil), facilitator.ReasonInvalidPayload},
		{"no requirements", edit("paymentRequirements", nil), facilitator.ReasonInvalidPaymentRequirements},
		{"no version", edit("paymentPayload.x402Version", nil), facilitator.ReasonInvalidX402Version},
		{"version 3", edit("paymentPayload.x402Version", 3), facilitator.ReasonInvalidX402Version},
		{"version as string", edit("paymentPayload.x402Version", "2"), facilitator.ReasonInvalidPayload},
		{"amount as number", edit("paymentRequirements.amount", 10000), facilitator.ReasonInvalidPaymentRequirements},
		{"negative amount", edit("paymentRequirements.amount", "-1"), facilitator.ReasonInvalidPaymentRequirements},
		{"amount over uint256", edit("paymentRequirements.amount", strings.Repeat("9", 79)), facilitator.ReasonInvalidPaymentRequirements},
		{"bad asset", edit("paymentRequirements.asset", "0x1234"), facilitator.ReasonInvalidPaymentRequirements},
		{"bad payTo", edit("paymentRequirements.payTo", "alice"), facilitator.ReasonInvalidPaymentRequirements},
		{"no scheme", edit("paymentRequirements.scheme", nil), facilitator.ReasonInvalidPaymentRequirements},
		{"extra is a string", edit("paymentRequirements.extra", "USD Coin"), facilitator.ReasonInvalidPaymentRequirements},
		{"extra.name is a number", edit("paymentRequirements.extra.name", 5), facilitator.ReasonInvalidPaymentRequirements},
		{"no authorization", edit("paymentPayload.payload.authorization", nil), facilitator.ReasonInvalidPayload},
		{"bad from", edit("paymentPayload.payload.authorization.from", "0xzz"), facilitator.ReasonInvalidPayload},
		{"value with spaces", edit("paymentPayload.payload.authorization.value", " 1"), facilitator.ReasonInvalidPayload},
		{"validBefore hex", edit("paymentPayload.payload.authorization.validBefore", "0x10"), facilitator.ReasonInvalidPayload},
		{"short nonce", edit("paymentPayload.payload.authorization.nonce", "0x01"), facilitator.ReasonInvalidPayload},
		{"signature not hex", edit("paymentPayload.payload.signature", "hello"), facilitator.ReasonInvalidPayload},
		{"empty signature", edit("paymentPayload.payload.signature", "0x"), facilitator.ReasonInvalidPayload},
		{"payload is a string", edit("paymentPayload.payload", "x"), facilitator.ReasonInvalidPayload},
		{"oversized", `{"pad":"` + strings.Repeat("a", facilitator.MaxBodyBytes) + `"}`, facilitator.ReasonInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := facilitator.DecodeRequest([]byte(tc.body))
			if err == nil {
				t.Fatalf("decoded %+v", p)
			}
			if facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") != tc.reason {
				t.Fatalf("got %v (code %s), want reason %s", err, facilitator.ErrorCode(err), tc.reason)
			}
			if facilitator.ErrorMessage(err) == "" {
				t.Fatal("no message for the caller")
			}
		})
	}
}

// FuzzDecodeRequest: whatever arrives, the decoder returns a payment or an EInvalid error with a
// reason; it never panics, and what it accepts is complete enough for verify to use.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(validV2))
	f.Add([]byte(validV1))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"paymentPayload":{"x402Version":2,"payload":{"permit2Authorization":{}}},"paymentRequirements":{"scheme":"exact","network":"x","amount":"1","asset":"0x0000000000000000000000000000000000000000","payTo":"0x0000000000000000000000000000000000000000"}}`))
	f.Add([]byte(`{"paymentPayload":null,"paymentRequirements":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := facilitator.DecodeRequest(body)
		if err != nil {
			if facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") == "" || facilitator.ErrorMessage(err) == "" {
				t.Fatalf("error without an invalid code, reason and message: %v", err)
			}
			return
		}
		if p.X402Version != 1 && p.X402Version != 2 {
			t.Fatalf("accepted version %d", p.X402Version)
		}
		if p.Requirements.Amount == nil || p.Requirements.Scheme == "" || p.Requirements.Network == "" {
			t.Fatalf("accepted incomplete requirements %+v", p.Requirements)
		}
		if p.Permit2 {
			return
		}
		a := p.Authorization
		if a.Value == nil || a.ValidAfter == nil || a.ValidBefore == nil || len(p.Signature) == 0 {
			t.Fatalf("accepted incomplete authorization %+v", a)
		}
		for _, n := range []string{a.Value.String(), a.ValidAfter.String(), a.ValidBefore.String(), p.Requirements.Amount.String()} {
			if strings.HasPrefix(n, "-") || len(n) > 78 {
				t.Fatalf("accepted out-of-range number %s", n)
			}
		}
	})
}

func TestFormatUnits(t *testing.T) {
	for _, c := range []struct {
		value    string
		decimals uint8
		want     string
	}{
		{"250000", 6, "0.25"},
		{"1000000", 6, "1"},
		{"1", 6, "0.000001"},
		{"0", 6, "0"},
		{"000120", 6, "0.00012"},
		{"123456789", 6, "123.456789"},
		{"115792089237316195423570985008687907853269984665640564039457584007913129639935", 18,
			"115792089237316195423570985008687907853269984665640564039457.584007913129639935"},
		{"42", 0, "42"},
		{"", 6, ""},
		{"-5", 6, "-5"},
		{"1e6", 6, "1e6"},
	} {
		if got := facilitator.FormatUnits(c.value, c.decimals); got != c.want {
			t.Errorf("FormatUnits(%q, %d) = %q, want %q", c.value, c.decimals, got, c.want)
		}
	}
}

// BenchmarkDecodeRequest decodes a v2 /verify body as the official client sends it: the first cost
// of every /verify and /settle (go test ./facilitator/ -run '^$' -bench DecodeRequest).
func BenchmarkDecodeRequest(b *testing.B) {
	body := []byte(validV2)
	b.ReportAllocs()
	for range b.N {
		if _, err := facilitator.DecodeRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}
