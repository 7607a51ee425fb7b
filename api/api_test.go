package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// env is the package's bench: the anvil with Circle's USDC shared by this package's tests and
// benchmarks, and the ledgers the settling tests name (Ledger). chain is env's chain. Nothing
// verify-only changes chain state: /verify only reads.
var (
	env   *stacktest.Env
	chain *devchain.Chain
)

func TestMain(m *testing.M) {
	stacktest.MainWith(m, stacktest.Options{V1Name: v1Name}, func(e *stacktest.Env) (int, error) {
		env, chain = e, e.Chain
		return m.Run(), nil
	})
}

// v1Name is the v1 network name the test network is served under (31337 has none upstream).
const v1Name = "anvil-local"

func testNetwork(v1 string) facilitator.Network {
	return facilitator.Network{
		ID:      facilitator.CAIP2(chain.ChainID),
		ChainID: chain.ChainID,
		V1Name:  v1,
		Tokens:  []facilitator.Token{{Address: chain.USDC.Address, Name: chain.USDC.Name, Version: chain.USDC.Version}},
	}
}

// signers are the facilitator addresses /supported advertises in these tests.
func signers() []common.Address {
	return []common.Address{chain.Accounts[0].Address, common.HexToAddress("0x00000000000000000000000000000000000000aa")}
}

// rpcCounter is a reverse proxy in front of anvil that counts HTTP round trips and the JSON-RPC
// calls inside them (a batch counts as one round trip and len(batch) calls).
type rpcCounter struct {
	URL               string
	roundTrips, calls atomic.Int64
}

func newRPCCounter(tb testing.TB, target string) *rpcCounter {
	tb.Helper()
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	c := &rpcCounter{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		c.roundTrips.Add(1)
		c.calls.Add(countCalls(body))
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		proxy.ServeHTTP(w, r)
	}))
	tb.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func countCalls(body []byte) int64 {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var batch []json.RawMessage
		if err := json.Unmarshal(body, &batch); err == nil {
			return int64(len(batch))
		}
	}
	return 1
}

// client is a JSON-RPC client through the proxy, closed when the test ends.
func (c *rpcCounter) client(tb testing.TB) *rpc.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.DialContext(ctx, c.URL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(client.Close)
	return client
}

func (c *rpcCounter) reset() {
	c.roundTrips.Store(0)
	c.calls.Store(0)
}

// stack is the facilitator's HTTP API served by httptest over a real Verifier.
type stack struct {
	URL  string
	RPC  *rpcCounter // nil when the verifier has a custom reader
	Logs *stacktest.SyncBuffer
}

type stackOptions struct {
	// Reader replaces the ethrpc.Reader on the chain (through the counting proxy).
	Reader        verify.Reader
	Network       *facilitator.Network
	VerifyTimeout time.Duration
}

func newStack(tb testing.TB, opts stackOptions) *stack {
	tb.Helper()
	n := testNetwork(v1Name)
	if opts.Network != nil {
		n = *opts.Network
	}
	s := &stack{Logs: &stacktest.SyncBuffer{}}
	o := stacktest.ServerOptions{Network: &n, Reader: opts.Reader, Signers: signers(),
		Logger: slog.New(slog.NewTextHandler(s.Logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Config: func(c *api.Config, _ *stacktest.Server) { c.VerifyTimeout = opts.VerifyTimeout }}
	if o.Reader == nil {
		s.RPC = newRPCCounter(tb, chain.RPCURL)
		o.Chain = s.RPC.client(tb)
	}
	s.URL = env.NewServer(tb, o).URL
	return s
}

// response is one HTTP answer, read in full.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) String() string { return fmt.Sprintf("HTTP %d %s", r.Status, r.Body) }

// do sends one request, saying its body (if any) is JSON, and reads the answer in full.
func do(tb testing.TB, method, u string, body []byte) response {
	tb.Helper()
	return doWith(tb, method, u, body, func(h http.Header) {
		if body != nil {
			h.Set("Content-Type", "application/json")
		}
	})
}

// doWith sends one request with the headers set sets and reads the answer in full.
func doWith(tb testing.TB, method, u string, body []byte, set func(http.Header)) response {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		tb.Fatal(err)
	}
	set(req.Header)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, u, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatalf("%s %s: reading the body: %v", method, u, err)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: b}
}

func (s *stack) verify(tb testing.TB, body []byte) response {
	tb.Helper()
	return do(tb, http.MethodPost, s.URL+"/verify", body)
}

// payment is an EIP-3009 authorization a dev account signs with the chain's USDC domain.
type payment struct {
	version int
	payer   *devchain.Account
	auth    devchain.TransferAuthorization
}

// newPayment is a valid payment of 1 USDC from dev account #payer to a fresh recipient.
func newPayment(tb testing.TB, payer int) payment {
	acc := chain.Accounts[payer]
	var nonce [32]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		tb.Fatal(err)
	}
	key, err := crypto.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	return payment{
		version: 2,
		payer:   acc,
		auth: devchain.TransferAuthorization{
			From: acc.Address, To: crypto.PubkeyToAddress(key.PublicKey), Value: big.NewInt(1_000_000),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 600), Nonce: nonce,
		},
	}
}

// request returns the body an official client's merchant sends for p, as a mutable tree.
func (p payment) request(tb testing.TB) map[string]any {
	tb.Helper()
	sig, err := chain.USDC.SignTransferAuthorization(p.payer.Key, p.auth)
	if err != nil {
		tb.Fatal(err)
	}
	a := p.auth
	exact := map[string]any{
		"authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value.String(),
			"validAfter": a.ValidAfter.String(), "validBefore": a.ValidBefore.String(),
			"nonce": "0x" + common.Bytes2Hex(a.Nonce[:]),
		},
		"signature": "0x" + common.Bytes2Hex(sig),
	}
	extra := map[string]any{"name": chain.USDC.Name, "version": chain.USDC.Version}
	if p.version == 1 {
		return map[string]any{
			"x402Version":    1,
			"paymentPayload": map[string]any{"x402Version": 1, "scheme": "exact", "network": v1Name, "payload": exact},
			"paymentRequirements": map[string]any{
				"scheme": "exact", "network": v1Name, "maxAmountRequired": a.Value.String(),
				"resource": "http://merchant.test/paid", "description": "", "mimeType": "",
				"payTo": a.To.Hex(), "maxTimeoutSeconds": 60, "asset": chain.USDC.Address.Hex(), "extra": extra,
			},
		}
	}
	reqs := func() map[string]any {
		return map[string]any{
			"scheme": "exact", "network": facilitator.CAIP2(chain.ChainID), "amount": a.Value.String(),
			"asset": chain.USDC.Address.Hex(), "payTo": a.To.Hex(), "maxTimeoutSeconds": 60,
			"extra": maps.Clone(extra),
		}
	}
	return map[string]any{
		"x402Version": 2,
		"paymentPayload": map[string]any{
			"x402Version": 2,
			"payload":     exact,
			"resource":    map[string]any{"url": "http://merchant.test/paid"},
			"accepted":    reqs(),
			"extensions":  map[string]any{},
		},
		"paymentRequirements": reqs(),
	}
}

func (p payment) body(tb testing.TB) []byte {
	return marshal(tb, p.request(tb))
}

func marshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// set replaces the value at a dotted path ("paymentPayload.payload.signature").
func set(m map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	m[parts[len(parts)-1]] = v
}

// get returns the value at a dotted path.
func get(m map[string]any, path string) any {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	return m[parts[len(parts)-1]]
}

// del removes the key at a dotted path.
func del(m map[string]any, path string) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	delete(m, parts[len(parts)-1])
}

// edited returns the body of a fresh valid v2 request after edit.
func edited(tb testing.TB, edit func(m map[string]any)) []byte {
	tb.Helper()
	m := newPayment(tb, 1).request(tb)
	edit(m)
	return marshal(tb, m)
}

// verdict decodes a VerifyResponse-shaped body and checks that it has no other keys.
func verdict(tb testing.TB, r response) (facilitator.VerifyResponse, map[string]json.RawMessage) {
	tb.Helper()
	return decodeAnswer[facilitator.VerifyResponse](tb, r, "VerifyResponse",
		[]string{"isValid", "invalidReason", "invalidMessage", "payer", "extensions", "extra"}, "isValid")
}

// decodeAnswer decodes an answer's body as a T (kind names it): JSON, an object with no keys
// but allowed, and each of required present. It returns the keys too.
func decodeAnswer[T any](tb testing.TB, r response, kind string, allowed []string, required ...string) (T, map[string]json.RawMessage) {
	tb.Helper()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		tb.Fatalf("Content-Type %q, want application/json (%s)", ct, r)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &keys); err != nil {
		tb.Fatalf("body is not a JSON object: %v (%s)", err, r)
	}
	for k := range keys {
		if !slices.Contains(allowed, k) {
			tb.Fatalf("unexpected key %q in a %s (%s)", k, kind, r)
		}
	}
	for _, k := range required {
		if _, ok := keys[k]; !ok {
			tb.Fatalf("%q missing (%s)", k, r)
		}
	}
	var res T
	if err := json.Unmarshal(r.Body, &res); err != nil {
		tb.Fatalf("body is not a %s: %v (%s)", kind, err, r)
	}
	return res, keys
}

func TestVerifyValid(t *testing.T) {
	s := newStack(t, stackOptions{})

	t.Run("v2", func(t *testing.T) {
		p := newPayment(t, 1)
		r := s.verify(t, p.body(t))
		if r.Status != http.StatusOK {
			t.Fatalf("want 200, got %s", r)
		}
		res, keys := verdict(t, r)
		if got := slices.Sorted(maps.Keys(keys)); !reflect.DeepEqual(got, []string{"isValid", "payer"}) {
			t.Fatalf("keys %v, want exactly [isValid payer] (%s)", got, r)
		}
		if string(keys["isValid"]) != "true" || res.Payer != p.auth.From.Hex() {
			t.Fatalf("want isValid true payer %s, got %s", p.auth.From.Hex(), r)
		}
		if !strings.HasPrefix(res.Payer, "0x") {
			t.Fatalf("payer %q", res.Payer)
		}
	})

	t.Run("v1", func(t *testing.T) {
		p := newPayment(t, 2)
		p.version = 1
		r := s.verify(t, p.body(t))
		if r.Status != http.StatusOK {
			t.Fatalf("want 200, got %s", r)
		}
		if res, _ := verdict(t, r); !res.IsValid || res.Payer != p.auth.From.Hex() {
			t.Fatalf("want valid, got %s", r)
		}
	})

	t.Run("payer echoed as sent", func(t *testing.T) {
		p := newPayment(t, 3)
		from := strings.ToLower(p.auth.From.Hex())
		m := p.request(t)
		set(m, "paymentPayload.payload.authorization.from", from)
		r := s.verify(t, marshal(t, m))
		if res, _ := verdict(t, r); r.Status != http.StatusOK || !res.IsValid || res.Payer != from {
			t.Fatalf("want valid with payer %s, got %s", from, r)
		}
	})
}

// TestVerifyInvalid: a payment that fails a check is a verdict, 200 with the reason.
func TestVerifyInvalid(t *testing.T) {
	s := newStack(t, stackOptions{})
	cases := []struct {
		name   string
		edit   func(m map[string]any)
		reason string
	}{
		{"value mismatch", func(m map[string]any) {
			set(m, "paymentRequirements.amount", "2000000")
			set(m, "paymentPayload.accepted.amount", "2000000")
		}, facilitator.ReasonValueMismatch},
		{"recipient mismatch", func(m map[string]any) {
			set(m, "paymentRequirements.payTo", chain.Accounts[9].Address.Hex())
		}, facilitator.ReasonRecipientMismatch},
		{"signature from another key", func(m map[string]any) {
			sig := make([]byte, 65)
			sig[64] = 27
			set(m, "paymentPayload.payload.signature", "0x"+common.Bytes2Hex(sig))
		}, facilitator.ReasonInvalidSignature},
		{"no EIP-712 domain", func(m map[string]any) { set(m, "paymentRequirements.extra", nil) }, facilitator.ReasonMissingEIP712Domain},
		{"accepted another network", func(m map[string]any) { set(m, "paymentPayload.accepted.network", "eip155:8453") }, facilitator.ReasonNetworkMismatch},
		{"Permit2 payload", func(m map[string]any) {
			set(m, "paymentPayload.payload.permit2Authorization", map[string]any{"from": chain.Accounts[1].Address.Hex()})
		}, facilitator.ReasonUnsupportedPayloadType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := s.verify(t, edited(t, tc.edit))
			if r.Status != http.StatusOK {
				t.Fatalf("want 200, got %s", r)
			}
			res, keys := verdict(t, r)
			if string(keys["isValid"]) != "false" || res.InvalidReason != tc.reason {
				t.Fatalf("want isValid false %s, got %s", tc.reason, r)
			}
			if tc.reason != facilitator.ReasonUnsupportedPayloadType && res.Payer != chain.Accounts[1].Address.Hex() {
				t.Fatalf("payer %q, want %s", res.Payer, chain.Accounts[1].Address.Hex())
			}
		})
	}
}

// badInput is a request the facilitator cannot process as sent.
type badInput struct {
	name   string
	body   []byte
	reason string
}

func badInputs(t *testing.T) []badInput {
	v2 := func(edit func(m map[string]any)) []byte { return edited(t, edit) }
	huge := func(size int) []byte {
		m := newPayment(t, 1).request(t)
		m["padding"] = ""
		n := len(marshal(t, m))
		m["padding"] = strings.Repeat("a", size-n)
		b := marshal(t, m)
		if len(b) != size {
			t.Fatalf("padded body is %d bytes, want %d", len(b), size)
		}
		return b
	}
	v1 := newPayment(t, 1)
	v1.version = 1
	v1Unknown := v1.request(t)
	set(v1Unknown, "paymentRequirements.network", "base")

	const (
		payload = facilitator.ReasonInvalidPayload
		reqs    = facilitator.ReasonInvalidPaymentRequirements
	)
	return []badInput{
		{"malformed JSON", []byte(`{"x402Version":2,"paymentPayload":{`), payload},
		{"not JSON at all", []byte(`x402 please`), payload},
		{"empty body", []byte{}, payload},
		{"null", []byte(`null`), payload},
		{"array", []byte(`[]`), payload},
		{"empty object", []byte(`{}`), payload},
		{"missing paymentPayload", v2(func(m map[string]any) { del(m, "paymentPayload") }), payload},
		{"null paymentPayload", v2(func(m map[string]any) { m["paymentPayload"] = nil }), payload},
		{"paymentPayload is a string", v2(func(m map[string]any) { m["paymentPayload"] = "eyJ4NDAy" }), payload},
		{"missing paymentRequirements", v2(func(m map[string]any) { del(m, "paymentRequirements") }), reqs},
		{"paymentRequirements is an array", v2(func(m map[string]any) { m["paymentRequirements"] = []any{} }), reqs},
		{"amount as number", v2(func(m map[string]any) { set(m, "paymentRequirements.amount", 1000000) }), reqs},
		{"amount not decimal", v2(func(m map[string]any) { set(m, "paymentRequirements.amount", "1e6") }), reqs},
		{"maxTimeoutSeconds as string", v2(func(m map[string]any) { set(m, "paymentRequirements.maxTimeoutSeconds", "60") }), reqs},
		{"extra is a string", v2(func(m map[string]any) { set(m, "paymentRequirements.extra", "USD Coin") }), reqs},
		{"x402Version as string", v2(func(m map[string]any) { set(m, "paymentPayload.x402Version", "2") }), payload},
		{"x402Version missing", v2(func(m map[string]any) { del(m, "paymentPayload.x402Version") }), facilitator.ReasonInvalidX402Version},
		{"unknown x402Version", v2(func(m map[string]any) { set(m, "paymentPayload.x402Version", 3) }), facilitator.ReasonInvalidX402Version},
		{"oversized body (1 MiB)", huge(1 << 20), payload},
		{"body one byte over the limit", huge(facilitator.MaxBodyBytes + 1), payload},
		{"invalid payTo address", v2(func(m map[string]any) { set(m, "paymentRequirements.payTo", "0x1234") }), reqs},
		{"invalid asset address", v2(func(m map[string]any) { set(m, "paymentRequirements.asset", "USDC") }), reqs},
		{"invalid from address", v2(func(m map[string]any) {
			set(m, "paymentPayload.payload.authorization.from", "0xZZ00000000000000000000000000000000000000")
		}), payload},
		{"negative value", v2(func(m map[string]any) { set(m, "paymentPayload.payload.authorization.value", "-1") }), payload},
		{"value above uint256", v2(func(m map[string]any) {
			set(m, "paymentPayload.payload.authorization.value", "1"+strings.Repeat("0", 78))
		}), payload},
		{"value as number", v2(func(m map[string]any) { set(m, "paymentPayload.payload.authorization.value", 1000000) }), payload},
		{"short nonce", v2(func(m map[string]any) { set(m, "paymentPayload.payload.authorization.nonce", "0x01") }), payload},
		{"signature not hex", v2(func(m map[string]any) { set(m, "paymentPayload.payload.signature", "0xnothex") }), payload},
		{"empty signature", v2(func(m map[string]any) { set(m, "paymentPayload.payload.signature", "0x") }), payload},
		{"missing authorization", v2(func(m map[string]any) { del(m, "paymentPayload.payload.authorization") }), payload},
		{"missing payload", v2(func(m map[string]any) { del(m, "paymentPayload.payload") }), payload},
		{"missing scheme", v2(func(m map[string]any) { del(m, "paymentRequirements.scheme") }), reqs},
		{"unknown network", v2(func(m map[string]any) {
			set(m, "paymentRequirements.network", "eip155:1")
			set(m, "paymentPayload.accepted.network", "eip155:1")
		}), facilitator.ReasonInvalidNetwork},
		{"v2 with a v1 network name", v2(func(m map[string]any) { set(m, "paymentRequirements.network", v1Name) }), facilitator.ReasonInvalidNetwork},
		{"v1 unknown network", marshal(t, v1Unknown), facilitator.ReasonInvalidNetwork},
		{"unknown scheme", v2(func(m map[string]any) {
			set(m, "paymentRequirements.scheme", "upto")
			set(m, "paymentPayload.accepted.scheme", "upto")
		}), facilitator.ReasonUnsupportedScheme},
	}
}

// wantUnavailable fails the test unless r is a 503 with Retry-After.
func wantUnavailable(t *testing.T, r response) {
	t.Helper()
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %s", r)
	}
	if r.Header.Get("Retry-After") == "" {
		t.Fatalf("503 without Retry-After")
	}
}

// sendBadInput sends one request that cannot be processed and checks what every endpoint's answer
// to it shares: a 400 without Retry-After that does not echo the input, and no RPC call made for
// it.
func sendBadInput(t *testing.T, rpc *rpcCounter, send func() response) response {
	t.Helper()
	before := rpc.calls.Load()
	r := send()
	if r.Status != http.StatusBadRequest {
		t.Fatalf("want 400, got %s", r)
	}
	if r.Header.Get("Retry-After") != "" {
		t.Fatalf("Retry-After on a 400")
	}
	if len(r.Body) > 1024 {
		t.Fatalf("a %d-byte answer echoes too much input", len(r.Body))
	}
	if got := rpc.calls.Load() - before; got != 0 {
		t.Fatalf("%d RPC calls for a request that cannot be processed", got)
	}
	return r
}

// TestVerifyBadInput: what cannot be processed is a 400 with a VerifyResponse-shaped body, and
// touches neither the chain nor anything else.
func TestVerifyBadInput(t *testing.T) {
	s := newStack(t, stackOptions{})
	for _, tc := range badInputs(t) {
		t.Run(tc.name, func(t *testing.T) {
			r := sendBadInput(t, s.RPC, func() response { return s.verify(t, tc.body) })
			res, keys := verdict(t, r)
			if string(keys["isValid"]) != "false" || res.InvalidReason == "" || res.InvalidMessage == "" {
				t.Fatalf("want isValid false with a reason and a message, got %s", r)
			}
			if res.InvalidReason != tc.reason {
				t.Fatalf("reason %q, want %q (%s)", res.InvalidReason, tc.reason, r)
			}
		})
	}
	if strings.Contains(s.Logs.String(), "level=ERROR") {
		t.Fatalf("client errors logged as server errors:\n%s", s.Logs)
	}
}

// TestVerifyTolerant: unknown fields anywhere are ignored, as newer clients add keys.
func TestVerifyTolerant(t *testing.T) {
	s := newStack(t, stackOptions{})
	cases := map[string]func(m map[string]any){
		"unknown fields everywhere": func(m map[string]any) {
			m["traceId"] = "abc"
			set(m, "paymentPayload.futureField", map[string]any{"a": []any{1, 2}})
			set(m, "paymentPayload.resource.serviceName", "weather")
			set(m, "paymentPayload.resource.somethingNew", true)
			set(m, "paymentPayload.accepted.extra.paymentFlow", "authorization")
			set(m, "paymentPayload.extensions", map[string]any{"bazaar": map[string]any{"info": map[string]any{}}})
			set(m, "paymentPayload.payload.note", "hi")
			set(m, "paymentPayload.payload.authorization.memo", "x")
			set(m, "paymentRequirements.extra.assetTransferMethod", "eip3009")
			set(m, "paymentRequirements.outputSchema", nil)
			set(m, "paymentRequirements.description", "a description")
		},
		"top-level x402Version ignored": func(m map[string]any) { m["x402Version"] = 1 },
		"top-level x402Version absent":  func(m map[string]any) { del(m, "x402Version") },
		"no resource, no extensions": func(m map[string]any) {
			del(m, "paymentPayload.resource")
			del(m, "paymentPayload.extensions")
		},
		"lower-case addresses": func(m map[string]any) {
			for _, path := range []string{"paymentRequirements.asset", "paymentRequirements.payTo", "paymentPayload.payload.authorization.to"} {
				set(m, path, strings.ToLower(get(m, path).(string)))
			}
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			r := s.verify(t, edited(t, edit))
			if res, _ := verdict(t, r); r.Status != http.StatusOK || !res.IsValid {
				t.Fatalf("want 200 valid, got %s", r)
			}
		})
	}
	t.Run("body of exactly MaxBodyBytes", func(t *testing.T) {
		m := newPayment(t, 1).request(t)
		m["padding"] = ""
		m["padding"] = strings.Repeat("a", facilitator.MaxBodyBytes-len(marshal(t, m)))
		body := marshal(t, m)
		if len(body) != facilitator.MaxBodyBytes {
			t.Fatalf("body is %d bytes", len(body))
		}
		if r := s.verify(t, body); r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(`"isValid":true`)) {
			t.Fatalf("want 200 valid, got %s", r)
		}
	})
}

// TestVerifyNeverServerError: no client input gets a 5xx, from the bad inputs above to odd
// signatures that reach the chain.
func TestVerifyNeverServerError(t *testing.T) {
	s := newStack(t, stackOptions{})
	magic := common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")
	hostile := append(bytes.Repeat([]byte{0xff}, 96), magic...)
	sigs := map[string][]byte{
		"one byte":                    {0x01},
		"64 bytes":                    make([]byte, 64),
		"65 bytes, v 99":              append(make([]byte, 64), 99),
		"6492 magic only":             magic,
		"6492 wrapper, huge offsets":  hostile,
		"6492 wrapper, zero factory":  append(make([]byte, 96), magic...),
		"1 KiB of garbage":            bytes.Repeat([]byte{0xab}, 1024),
		"6492 wrapper with no inner":  append(append(make([]byte, 12), bytes.Repeat([]byte{0x11}, 20)...), magic...),
		"65 bytes, s above the curve": append(bytes.Repeat([]byte{0xff}, 64), 27),
	}
	var bodies []badInput
	bodies = append(bodies, badInputs(t)...)
	for name, sig := range sigs {
		bodies = append(bodies, badInput{name: "signature " + name, body: edited(t, func(m map[string]any) {
			set(m, "paymentPayload.payload.signature", "0x"+common.Bytes2Hex(sig))
		})})
	}
	bodies = append(bodies,
		badInput{name: "top-level x402Version as string", body: edited(t, func(m map[string]any) { m["x402Version"] = "2" })},
		badInput{name: "zero from", body: edited(t, func(m map[string]any) {
			set(m, "paymentPayload.payload.authorization.from", "0x0000000000000000000000000000000000000000")
		})},
		badInput{name: "max uint256 everywhere", body: edited(t, func(m map[string]any) {
			maxU := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1)).String()
			for _, f := range []string{"value", "validAfter", "validBefore"} {
				set(m, "paymentPayload.payload.authorization."+f, maxU)
			}
			set(m, "paymentRequirements.amount", maxU)
		})},
		badInput{name: "asset is an EOA", body: edited(t, func(m map[string]any) { set(m, "paymentRequirements.asset", chain.Accounts[5].Address.Hex()) })},
		badInput{name: "negative maxTimeoutSeconds", body: edited(t, func(m map[string]any) { set(m, "paymentRequirements.maxTimeoutSeconds", -1) })},
		badInput{name: "deeply nested", body: []byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000))},
	)
	for _, tc := range bodies {
		r := s.verify(t, tc.body)
		if r.Status >= 500 {
			t.Errorf("%s: %s", tc.name, r)
			continue
		}
		if res, _ := verdict(t, r); !res.IsValid && res.InvalidReason == "" {
			t.Errorf("%s: an invalid verdict without a reason: %s", tc.name, r)
		}
	}
}

// failingReader is a chain that never answers; its error carries what must not reach a client.
type failingReader struct{ err error }

func (f failingReader) Read(context.Context, ...*ethrpc.Read) error { return f.err }

// hangingReader is a chain that answers only when the caller gives up.
type hangingReader struct{}

func (hangingReader) Read(ctx context.Context, _ ...*ethrpc.Read) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestVerifyRPCDown: no verdict without the chain: 503 with Retry-After, never a leaked cause.
func TestVerifyRPCDown(t *testing.T) {
	const secretURL = "https://rpc.internal.example/v2/s3cr3t-api-key"
	cause := fmt.Errorf("Post %q: dial tcp 10.1.2.3:443: connect: connection refused", secretURL)

	// A real ethrpc.Reader whose node is gone.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	client, err := rpc.DialContext(context.Background(), deadURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)

	cases := []struct {
		name    string
		opts    stackOptions
		secrets []string // must not reach the client
		logged  string   // must reach the operator's error log
	}{
		{"reader fails", stackOptions{Reader: failingReader{err: cause}},
			[]string{secretURL, "s3cr3t", "rpc.internal.example", "dial tcp", "connection refused", "10.1.2.3"}, "s3cr3t"},
		{"node unreachable", stackOptions{Reader: &ethrpc.Reader{Chain: client, Timeout: 2 * time.Second}},
			[]string{deadURL, strings.TrimPrefix(deadURL, "http://"), "dial tcp", "connection refused"}, "connection refused"},
		{"node hangs past the verify timeout", stackOptions{Reader: hangingReader{}, VerifyTimeout: 200 * time.Millisecond},
			[]string{"context deadline exceeded"}, "context deadline exceeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, tc.opts)
			p := newPayment(t, 1)
			r := s.verify(t, p.body(t))
			wantUnavailable(t, r)
			res, keys := verdict(t, r)
			if string(keys["isValid"]) != "false" || res.InvalidReason != facilitator.ReasonUnexpectedVerifyError || res.InvalidMessage == "" {
				t.Fatalf("want isValid false unexpected_verify_error with a message, got %s", r)
			}
			if res.Payer != p.auth.From.Hex() {
				t.Fatalf("payer %q, want %s", res.Payer, p.auth.From.Hex())
			}
			for _, secret := range tc.secrets {
				if bytes.Contains(r.Body, []byte(secret)) {
					t.Fatalf("body leaks %q: %s", secret, r)
				}
			}
			// The operator, unlike the client, must see the cause.
			if logs := s.Logs.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, tc.logged) {
				t.Fatalf("the cause is not in the error log:\n%s", logs)
			}
		})
	}
}

func TestSupported(t *testing.T) {
	addrs := []any{}
	for _, a := range signers() {
		addrs = append(addrs, a.Hex())
	}
	network := facilitator.CAIP2(chain.ChainID)
	if network != "eip155:31337" {
		t.Fatalf("devchain serves %s, these tests assume eip155:31337", network)
	}
	v2Kind := map[string]any{"x402Version": 2.0, "scheme": "exact", "network": "eip155:31337"}
	cases := []struct {
		name  string
		v1    string
		kinds []any
	}{
		{"with a v1 name", v1Name, []any{v2Kind, map[string]any{"x402Version": 1.0, "scheme": "exact", "network": v1Name}}},
		{"without a v1 name", "", []any{v2Kind}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := testNetwork(tc.v1)
			s := newStack(t, stackOptions{Network: &n})
			r := do(t, http.MethodGet, s.URL+"/supported", nil)
			if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("want 200 JSON, got %s (%s)", r, r.Header.Get("Content-Type"))
			}
			var got any
			if err := json.Unmarshal(r.Body, &got); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{
				"kinds":      tc.kinds,
				"extensions": []any{},
				"signers":    map[string]any{"eip155:*": addrs},
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %s\nwant %s", r.Body, marshal(t, want))
			}
			if !bytes.Contains(r.Body, []byte(`"extensions":[]`)) {
				t.Fatalf("extensions must be [] on the wire: %s", r.Body)
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	s := newStack(t, stackOptions{})
	cases := []struct {
		method, path string
		status       int
		body         string
	}{
		{http.MethodGet, "/healthz", http.StatusOK, `{"status":"ok"}`},
		{http.MethodGet, "/nope", http.StatusNotFound, `{"error":"Not Found"}`},
		{http.MethodPost, "/settle/nope", http.StatusNotFound, `{"error":"Not Found"}`},
		{http.MethodGet, "/verify", http.StatusMethodNotAllowed, `{"error":"Method Not Allowed"}`},
		{http.MethodPost, "/supported", http.StatusMethodNotAllowed, `{"error":"Method Not Allowed"}`},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := do(t, tc.method, s.URL+tc.path, nil)
			if r.Status != tc.status || strings.TrimSpace(string(r.Body)) != tc.body {
				t.Fatalf("want %d %s, got %s", tc.status, tc.body, r)
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Fatalf("Content-Type %q", ct)
			}
		})
	}
}

// TestVerifyRPCBudget: a valid verify is one round trip, batching the payer's code with the
// simulation and the answering node's head (a lagging node's answer is not used); the token's code
// and its EIP-712 name and version are read once, in that round trip, and then cached.
func TestVerifyRPCBudget(t *testing.T) {
	s := newStack(t, stackOptions{})
	for i, want := range []int64{6, 3, 3} {
		s.RPC.reset()
		r := s.verify(t, newPayment(t, 1+i).body(t))
		if res, _ := verdict(t, r); r.Status != http.StatusOK || !res.IsValid {
			t.Fatalf("want 200 valid, got %s", r)
		}
		if calls, trips := s.RPC.calls.Load(), s.RPC.roundTrips.Load(); calls != want || trips != 1 {
			t.Fatalf("verify #%d: %d calls in %d round trips, want %d in 1", i+1, calls, trips, want)
		}
	}
}
