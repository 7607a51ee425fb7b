package status_test

import (
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// FuzzParseNonce runs in this package's test binary, whose TestMain needs anvil and Postgres
// (scripts/fuzz.sh provides both); the target itself touches neither.

var fuzzNonceRE = regexp.MustCompile(`^0[xX][0-9a-fA-F]{64}$`)

// fuzzRequest is a well-formed v2 request whose nonce is replaced.
const fuzzRequest = `{"paymentPayload":{"x402Version":2,"payload":{"authorization":{"from":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","value":"1","validAfter":"0","validBefore":"4102444800","nonce":NONCE},"signature":"0x01"},"accepted":{"scheme":"exact","network":"eip155:8453"}},"paymentRequirements":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"}}`

// FuzzParseNonce: a nonce parameter is accepted exactly when it is 0x (or 0X) and 64 hex digits,
// in any case, and then decodes to those bytes; and the status routes accept exactly the nonces
// /verify and /settle accept, so every authorization they settle can be looked up.
func FuzzParseNonce(f *testing.F) {
	for _, s := range []string{
		"0x" + strings.Repeat("ab", 32), "0X" + strings.Repeat("AB", 32), "0x" + strings.Repeat("ab", 31), "0x" + strings.Repeat("ab", 33),
		strings.Repeat("ab", 32), "0x" + strings.Repeat("ab", 31) + "a", "0x" + strings.Repeat("ab", 31) + "zz", "", "0x", "0", "x",
		"0x" + strings.Repeat("ab", 31) + "\x00\x00", " 0x" + strings.Repeat("ab", 32), "0x" + strings.Repeat("ab", 32) + "\n", "0x+" + strings.Repeat("a", 63),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := status.ParseNonce(s)
		if ok != fuzzNonceRE.MatchString(s) {
			t.Fatalf("ParseNonce(%q) ok = %v", s, ok)
		}
		if ok && !strings.EqualFold(hex.EncodeToString(n[:]), s[2:]) {
			t.Fatalf("ParseNonce(%q) = %x", s, n)
		}
		if !ok && n != [32]byte{} {
			t.Fatalf("ParseNonce(%q) refused but returned %x", s, n)
		}
		if !utf8.ValidString(s) {
			return // JSON cannot carry it as is
		}
		q, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		p, err := facilitator.DecodeRequest([]byte(strings.Replace(fuzzRequest, "NONCE", string(q), 1)))
		if (err == nil) != ok {
			t.Fatalf("nonce %q: ParseNonce ok = %v, DecodeRequest: %v", s, ok, err)
		}
		if ok && p.Authorization.Nonce != n {
			t.Fatalf("nonce %q: %x in a request, %x in a path", s, p.Authorization.Nonce, n)
		}
	})
}
