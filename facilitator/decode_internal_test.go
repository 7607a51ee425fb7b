package facilitator

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// decodeSeparately is DecodeRequest without the one-pass union: the version read first, then the
// generation's own struct (ParseRequest's fallback, and the code before the union).
func decodeSeparately(body []byte) (*Payment, error) {
	if len(body) > MaxBodyBytes {
		return nil, Errorf(EInvalid, ReasonInvalidPayload, "request body is larger than %d bytes", MaxBodyBytes)
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, Errorf(EInvalid, ReasonInvalidPayload, "request body: %s", jsonProblem(err))
	}
	if isNull(req.PaymentPayload) || isNull(req.PaymentRequirements) {
		return ParseRequest(req)
	}
	var head struct {
		X402Version *int `json:"x402Version"`
	}
	if err := json.Unmarshal(req.PaymentPayload, &head); err != nil || head.X402Version == nil || (*head.X402Version != 1 && *head.X402Version != 2) {
		return ParseRequest(req) // an error either way, from the fallback
	}
	var p *Payment
	var err error
	if *head.X402Version == 2 {
		p, err = parseV2(req, nil, nil, nil)
	} else {
		p, err = parseV1(req, nil, nil, nil)
	}
	if err == nil {
		p.Body = body
	}
	return p, err
}

const decodeSeedV2 = `{"x402Version":2,"paymentPayload":{"x402Version":2,"payload":{"authorization":{"from":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","value":"10000","validAfter":"0","validBefore":"4102444800","nonce":"0x5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"},"signature":"0xabab1b"},"resource":{"url":"http://x/y"},"accepted":{"scheme":"exact","network":"eip155:31337","amount":"10000","asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2"}},"extensions":{"payment-identifier":{"info":{"id":"pay_0123456789abcdef"}}}},"paymentRequirements":{"scheme":"exact","network":"eip155:31337","amount":"10000","asset":"0x036cbd53842c5426634e7929541ec2318f3dcf7e","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2"}}}`

const decodeSeedV1 = `{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"base-sepolia","payload":{"authorization":{"from":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","value":"10000","validAfter":"1700000000","validBefore":"4102444800","nonce":"0x5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"},"signature":"0x00"}},"paymentRequirements":{"scheme":"exact","network":"base-sepolia","maxAmountRequired":"10000","resource":"http://x/y","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","extra":{"name":"USDC","version":"2"}}}`

// FuzzDecodeOnePass: the one-pass union decode gives exactly what the separate decodes give,
// payment or error, for any body. Seeds include the shapes where a union could differ: the other
// generation's fields with wrong types, duplicated and case-folded keys, nulls.
func FuzzDecodeOnePass(f *testing.F) {
	for _, s := range []string{
		decodeSeedV2, decodeSeedV1,
		`{"paymentPayload":{"x402Version":2,"scheme":5,"network":[],"accepted":{"scheme":"exact"}},"paymentRequirements":{}}`,
		`{"paymentPayload":{"x402Version":1,"accepted":7,"extensions":"x","resource":1},"paymentRequirements":{"scheme":"exact"}}`,
		`{"paymentPayload":{"x402Version":2,"X402VERSION":1,"payload":{"signature":"0x01"},"Payload":null},"paymentRequirements":{"scheme":"exact"}}`,
		`{"paymentPayload":{"x402Version":2,"payload":{"signature":"0x01","authorization":{}},"payload":{"signature":"0x02"}},"paymentRequirements":{}}`,
		`{"paymentPayload":{"x402Version":3},"paymentRequirements":{}}`,
		`{"paymentPayload":{"x402Version":null},"paymentRequirements":{}}`,
		`{"paymentPayload":{"x402Version":2.5},"paymentRequirements":{}}`,
		`{"paymentPayload":null,"paymentRequirements":{}}`,
		`{"paymentPayload":{"x402Version":2},"paymentRequirements":{"extra":{"NAME":"x","name":"USD \u0043oin","version":"\u00e9"}}}`,
	} {
		f.Add([]byte(s))
	}
	// Where one decode would merge what the level-by-level decode replaces: a key that comes
	// twice (as written, in another case, or escaped), with the valid payment split across both.
	v2 := decodeSeedV2
	payload := v2[strings.Index(v2, `"payload":`):strings.Index(v2, `,"resource"`)]
	reqs := v2[strings.Index(v2, `"paymentRequirements":`) : len(v2)-1]
	for _, s := range []string{
		strings.Replace(v2, `{"x402Version":2,"paymentPayload"`, `{"paymentRequirements":{"scheme":"exact"},"paymentPayload"`, 1),
		v2[:len(v2)-1] + `,"paymentPayload":{"x402Version":2}}`,
		v2[:len(v2)-1] + `,"PAYMENTPAYLOAD":{"x402Version":1}}`,
		v2[:len(v2)-1] + `,"payment\u0050ayload":{"x402Version":1}}`,
		v2[:len(v2)-1] + "," + strings.Replace(reqs, `"paymentRequirements"`, `"PaymentRequirements"`, 1) + `}`,
		strings.Replace(v2, payload, `"payload":{"signature":"0xabab1b"},`+strings.Replace(payload, `"signature":"0xabab1b"`, `"signature":null`, 1), 1),
		strings.Replace(v2, payload, payload+`,"Payload":{"signature":"0x01"}`, 1),
		strings.Replace(v2, `"USD Coin"`, `"USD Co\u0069n"`, 1),
		strings.Replace(v2, `"USD Coin"`, `"USD Coïn"`, 1),
		strings.Replace(v2, `"extensions":{`, `"extensions":{"x":"payload",`, 1),
		strings.Replace(v2, `"payload":`, `"payloaſ":{},"payload":`, 1),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, gotErr := DecodeRequest(body)
		want, wantErr := decodeSeparately(body)
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("error %v, separately %v", gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded\n%+v\nseparately\n%+v", got, want)
		}
	})
}

// FuzzPlainString: where plainString takes a JSON string itself, the decoder reads the same.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`"USD Coin"`, `"2"`, `""`, `"a\"b"`, `"\u00e9"`, `"é"`, "\"\xff\"", `5`, `"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := plainString(raw)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(raw, &want); err != nil {
			// plainString's input has passed a decoder already; for raw that is not JSON it must
			// still never claim a string the decoder would not read.
			if json.Valid(raw) {
				t.Fatalf("plainString(%q) = %q, decoder: %v", raw, got, err)
			}
			return
		}
		if got != want {
			t.Fatalf("plainString(%q) = %q, decoder %q", raw, got, want)
		}
	})
}
