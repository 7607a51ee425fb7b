package api_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
)

// The fuzz targets here drive the echo handler in process over fakes: no chain, no database is
// touched. The package's TestMain still starts anvil (and skips everything without it), so run
// them through scripts/fuzz.sh (make fuzz), e.g.
//
//	go test ./api -run '^$' -fuzz '^FuzzAuthorizationPath$' -fuzztime 60s
//
// with node_modules installed (scripts/npm.sh). Without -fuzz, go test runs their seeds.

// fuzzRecorder is the fakes' memory of what reached them, reset before each input.
type fuzzRecorder struct {
	mu        sync.Mutex
	keys      []facilitator.AuthorizationKey // Status.Authorization and Store.SettlementByKey
	ids       []string                       // Status.Payment and Store.PaymentID
	txs       []common.Hash
	after     []int64 // Store.SettlementEvents
	inserted  []facilitator.Webhook
	disabled  []string
	lastEvent int64
	attached  []facilitator.DeliveryAttachment // Deliveries.AttachDelivery
}

func (r *fuzzRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys, r.ids, r.txs, r.after, r.inserted, r.disabled, r.lastEvent, r.attached = nil, nil, nil, nil, nil, nil, 41, nil
}

func (r *fuzzRecorder) record(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
}

// fuzzStatus is api.Status (and notify.Status): every authorization is known.
type fuzzStatus struct{ r *fuzzRecorder }

func (s fuzzStatus) Authorization(_ context.Context, key facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	s.r.record(func() { s.r.keys = append(s.r.keys, key) })
	return facilitator.AuthorizationStatus{State: facilitator.StatusPending, Network: key.Network, Basis: "ledger"}, true, nil
}

func (s fuzzStatus) Payment(_ context.Context, _, id string) (facilitator.AuthorizationStatus, error) {
	s.r.record(func() { s.r.ids = append(s.r.ids, id) })
	return facilitator.AuthorizationStatus{State: facilitator.StatusPending, PaymentID: id, Basis: "ledger"}, nil
}

func (s fuzzStatus) Settlement(_ context.Context, tx common.Hash) (facilitator.AuthorizationStatus, error) {
	s.r.record(func() { s.r.txs = append(s.r.txs, tx) })
	return facilitator.AuthorizationStatus{State: facilitator.StatusPending, Transaction: tx.Hex(), Basis: "ledger"}, nil
}

// fuzzStore is notify.Store in memory: one settlement answers every key and id.
type fuzzStore struct{ r *fuzzRecorder }

func (s fuzzStore) InsertWebhook(_ context.Context, w *facilitator.Webhook, _ int) (bool, error) {
	w.CreatedAt = time.Unix(1700000000, 0)
	s.r.record(func() { s.r.inserted = append(s.r.inserted, *w) })
	return true, nil
}

func (s fuzzStore) Webhooks(context.Context, string) ([]facilitator.Webhook, error) { return nil, nil }

func (s fuzzStore) DisableWebhook(_ context.Context, _, id string) error {
	s.r.record(func() { s.r.disabled = append(s.r.disabled, id) })
	return nil
}

func (s fuzzStore) EnqueueWebhookEvents(context.Context, []string, int) (bool, error) {
	return false, nil
}

func (s fuzzStore) ClaimWebhookDeliveries(context.Context, facilitator.DeliveryClaim) ([]facilitator.WebhookDelivery, error) {
	return nil, nil
}

func (s fuzzStore) RecordWebhookAttempt(context.Context, facilitator.DeliveryAttempt) error {
	return nil
}

func (s fuzzStore) PruneWebhookDeliveries(context.Context, time.Time, int) (int64, error) {
	return 0, nil
}

func (s fuzzStore) settlement(key facilitator.AuthorizationKey) *facilitator.Settlement {
	return &facilitator.Settlement{ID: 7, Key: key, State: facilitator.StateBroadcast, Value: big.NewInt(1), ValidBefore: big.NewInt(1)}
}

func (s fuzzStore) SettlementByKey(_ context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	s.r.record(func() { s.r.keys = append(s.r.keys, key) })
	return s.settlement(key), nil
}

func (s fuzzStore) PaymentID(_ context.Context, _, id string) (*facilitator.PaymentIDRecord, error) {
	s.r.record(func() { s.r.ids = append(s.r.ids, id) })
	return &facilitator.PaymentIDRecord{ID: id, Settlement: s.settlement(facilitator.AuthorizationKey{Network: "eip155:8453"})}, nil
}

func (s fuzzStore) SettlementEvents(_ context.Context, _, after int64, _ []string, _ int) ([]facilitator.SettlementEvent, error) {
	s.r.record(func() { s.r.after = append(s.r.after, after) })
	return nil, nil
}

func (s fuzzStore) LastSettlementEvent(context.Context, int64) (int64, error) {
	var n int64
	s.r.record(func() { n = s.r.lastEvent })
	return n, nil
}

// fuzzVerifier refuses everything: no fuzz target posts to /verify or /settle, and if one did
// the answer would be a 400.
type fuzzVerifier struct{}

func (fuzzVerifier) Verify(context.Context, *facilitator.Payment) (facilitator.VerifyResponse, error) {
	return facilitator.VerifyResponse{}, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidPayload, "fuzz")
}

func (fuzzVerifier) Settle(context.Context, *facilitator.Payment) (facilitator.SettleOutcome, error) {
	return facilitator.SettleOutcome{}, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidPayload, "fuzz")
}

func (fuzzVerifier) ReleaseDelivery(context.Context, facilitator.SettleOutcome) error { return nil }
func (fuzzVerifier) ConfirmDelivery(context.Context, facilitator.SettleOutcome) error { return nil }

// fuzzAPI is the HTTP API over the fakes, with a real notify.Dispatcher (never started: only its
// registration and stream code runs) refusing private webhook targets.
type fuzzAPI struct {
	h   http.Handler
	rec *fuzzRecorder
}

func newFuzzAPI(f *testing.F) *fuzzAPI {
	rec := &fuzzRecorder{}
	st := fuzzStatus{r: rec}
	d := notify.New(notify.Config{Store: fuzzStore{r: rec}, Status: st, StreamPoll: time.Hour, KeepAlive: time.Hour, MaxStreams: 4})
	f.Cleanup(d.Stop)
	srv := api.New(api.Config{Verifier: fuzzVerifier{}, Settler: fuzzVerifier{}, Status: st, Notify: d,
		Deliveries: fuzzDeliveries{r: rec}, Supported: facilitator.Supported(nil, nil, nil)})
	return &fuzzAPI{h: srv.Handler(), rec: rec}
}

// fuzzDeliveries is api.Deliveries: every record is kept, for the authorization named or a lone one.
type fuzzDeliveries struct{ r *fuzzRecorder }

func (d fuzzDeliveries) AttachDelivery(_ context.Context, a facilitator.DeliveryAttachment) (facilitator.DeliveryCandidate, facilitator.DeliveryRecord, bool, error) {
	d.r.record(func() { d.r.attached = append(d.r.attached, a) })
	c := facilitator.DeliveryCandidate{ID: 1, State: facilitator.StateMined}
	if a.Authorization != nil {
		c.Key = *a.Authorization
	}
	rec := a.Record
	rec.RecordedAt = time.Unix(1, 0).UTC()
	return c, rec, true, nil
}

// serve answers one request. The request's context is already canceled, so an event stream ends
// after what it sends on opening.
func (a *fuzzAPI) serve(t *testing.T, method, target string, header map[string]string, body []byte) (*httptest.ResponseRecorder, *http.Request, bool) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://facilitator.test"+target, bytes.NewReader(body))
	if err != nil {
		return nil, nil, false // not a request line anyone can send
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	a.rec.reset()
	w := httptest.NewRecorder()
	a.h.ServeHTTP(w, req)
	if w.Code >= 500 {
		t.Fatalf("%s %q: HTTP %d %s", method, target, w.Code, w.Body)
	}
	return w, req, true
}

// fuzzSegments is what echo's router sees after prefix: it matches on the percent-encoded path
// (the server sets it as the raw path), and does not unescape parameters.
func fuzzSegments(req *http.Request, prefix string) ([]string, bool) {
	rest, ok := strings.CutPrefix(req.URL.EscapedPath(), prefix)
	if !ok {
		return nil, false
	}
	return strings.Split(rest, "/"), true
}

// fuzzRefusedPath checks the answer to a path not in its canonical form (api's access.go): 400
// non_canonical_path, before any handler; it reports whether req's path was one.
func fuzzRefusedPath(t *testing.T, a *fuzzAPI, w *httptest.ResponseRecorder, req *http.Request) bool {
	t.Helper()
	if api.CanonicalPath(req.URL.EscapedPath()) {
		return false
	}
	fuzzErrorBody(t, w, http.StatusBadRequest, facilitator.ReasonNonCanonicalPath)
	if r := a.rec; len(r.keys)+len(r.ids)+len(r.txs)+len(r.after)+len(r.inserted)+len(r.disabled) != 0 {
		t.Fatalf("%q, refused, reached the fakes: %+v", req.URL, r)
	}
	return true
}

// fuzzParam is the value a handler judges for a routed segment. echo hands path parameters over
// still percent-encoded when the request has a raw path. FINDING: so eip155%3A8453, which is what
// encodeURIComponent and OpenAPI-generated clients send for eip155:8453, is refused as a network.
// Once the handlers unescape their parameters this becomes url.PathUnescape(seg) (seg if that
// fails).
func fuzzParam(seg string) string {
	// The handlers percent-decode path parameters (what encodeURIComponent clients send).
	if u, err := url.PathUnescape(seg); err == nil {
		return u
	}
	return seg
}

// fuzzErrorBody checks a {"error": reason, "message": …} answer.
func fuzzErrorBody(t *testing.T, w *httptest.ResponseRecorder, status int, reason string) {
	t.Helper()
	var body map[string]string
	if w.Code != status || json.Unmarshal(w.Body.Bytes(), &body) != nil || body["error"] != reason || (status == http.StatusBadRequest && body["message"] == "") {
		t.Fatalf("want %d {error: %s, message}, got %d %s", status, reason, w.Code, w.Body)
	}
}

var (
	fuzzAddrRE     = regexp.MustCompile(`^0[xX][0-9a-fA-F]{40}$`)
	fuzzHash32RE   = regexp.MustCompile(`^0[xX][0-9a-fA-F]{64}$`)
	fuzzPayIDRE    = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	fuzzNetworkRE  = regexp.MustCompile(`^eip155:[0-9]+$`)
	fuzzEventIDRE  = regexp.MustCompile(`^\+?[0-9]+$`)
	fuzzWebhookRE  = regexp.MustCompile(`^wh_[0-9a-f]{32}$`)
	fuzzSecretRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	fuzzMaxInt64   = big.NewInt(1<<63 - 1)
	fuzzMaxUint64  = new(big.Int).SetUint64(1<<64 - 1)
	fuzzHeaderByte = regexp.MustCompile(`^[^\x00-\x08\x0a-\x1f\x7f]*$`)
)

// fuzzNetworkOK is the documented network parameter: eip155:<chain id> with a uint64 chain id.
func fuzzNetworkOK(s string) bool {
	if !fuzzNetworkRE.MatchString(s) {
		return false
	}
	n, _ := new(big.Int).SetString(s[len("eip155:"):], 10)
	return n.Cmp(fuzzMaxUint64) <= 0
}

// fuzzEventID is the documented Last-Event-ID: a decimal event id (header whitespace aside).
func fuzzEventID(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if !fuzzEventIDRE.MatchString(s) {
		return 0, false
	}
	n, _ := new(big.Int).SetString(strings.TrimPrefix(s, "+"), 10)
	if n.Cmp(fuzzMaxInt64) > 0 {
		return 0, false
	}
	return n.Int64(), true
}

func fuzzTarget(prefix string, segs []string, raw bool) string {
	out := make([]string, len(segs))
	for i, s := range segs {
		out[i] = s
		if !raw {
			out[i] = url.PathEscape(s)
		}
	}
	return prefix + strings.Join(out, "/")
}

// FuzzAuthorizationPath: GET /v1/authorizations/{network}/{asset}/{from}/{nonce} and its event
// stream answer 200 exactly when every parameter has its documented form (and, for the stream, the
// Last-Event-ID), with the key the parameters spell; otherwise 400 naming the first bad parameter,
// or 404 when the path is not the route's shape. The fakes are reached only with a valid key.
func FuzzAuthorizationPath(f *testing.F) {
	usdc, payer, nonce := "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "0x"+strings.Repeat("ab", 32)
	f.Add("eip155:8453", usdc, payer, nonce, false, "", false)
	f.Add("eip155:8453", strings.ToLower(usdc), "0X"+strings.ToUpper(payer[2:]), nonce, true, "42", false)
	f.Add("eip155:8453", usdc, payer, nonce, true, " +007 ", true)
	f.Add("eip155:8453", usdc, payer, nonce, true, "-1", false)
	f.Add("eip155:8453", usdc, payer, nonce, true, "9223372036854775808", false)
	f.Add("eip155:18446744073709551616", usdc, payer, nonce, false, "", false)
	f.Add("eip155%3A8453", usdc, payer, nonce, false, "", true)
	f.Add("eip155:8453", usdc, payer, nonce[:65], false, "", false)
	f.Add("eip155:8453", usdc, payer+"/x", nonce, false, "", true)
	f.Add("eip155:8453", usdc, payer, nonce+"%00", false, "", true)
	f.Add("eip155:8453", usdc, payer, "0x"+strings.Repeat("ab", 31)+"\x00\x00", false, "", false)
	f.Add("", "", "", "", true, "", false)
	f.Add("eip155:8453", usdc, payer, nonce, false, "", true)
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, network, asset, from, nonce string, events bool, lastEventID string, raw bool) {
		prefix := "/v1/authorizations/"
		if events {
			prefix = "/v1/events/authorizations/"
		}
		header := map[string]string{}
		if events && lastEventID != "" {
			if !fuzzHeaderByte.MatchString(lastEventID) {
				return // not a header value net/http would deliver
			}
			header["Last-Event-ID"] = lastEventID
		}
		w, req, ok := a.serve(t, http.MethodGet, fuzzTarget(prefix, []string{network, asset, from, nonce}, raw), header, nil)
		if !ok {
			return
		}
		if fuzzRefusedPath(t, a, w, req) {
			return
		}
		segs, ok := fuzzSegments(req, prefix)
		if !ok || len(segs) != 4 {
			if w.Code != http.StatusNotFound && w.Code != http.StatusBadRequest {
				t.Fatalf("%q is not the route's shape, got %d %s", req.URL, w.Code, w.Body)
			}
			return
		}
		if w.Code == http.StatusNotFound {
			// echo's router may refuse an empty segment; nothing may have been asked then.
			if len(a.rec.keys) != 0 || !(segs[0] == "" || segs[1] == "" || segs[2] == "" || segs[3] == "") {
				t.Fatalf("404 for %q with segments %q", req.URL, segs)
			}
			return
		}
		n, a0, fr, no := fuzzParam(segs[0]), fuzzParam(segs[1]), fuzzParam(segs[2]), fuzzParam(segs[3])
		after, eventOK := fuzzEventID(lastEventID)
		switch {
		case !fuzzNetworkOK(n):
			fuzzErrorBody(t, w, http.StatusBadRequest, facilitator.ReasonInvalidNetwork)
		case !fuzzAddrRE.MatchString(a0) || !fuzzAddrRE.MatchString(fr):
			fuzzErrorBody(t, w, http.StatusBadRequest, "invalid_parameter")
		case !fuzzHash32RE.MatchString(no):
			fuzzErrorBody(t, w, http.StatusBadRequest, "invalid_parameter")
		case events && lastEventID != "" && !eventOK:
			fuzzErrorBody(t, w, http.StatusBadRequest, "invalid_last_event_id")
		default:
			if w.Code != http.StatusOK {
				t.Fatalf("valid parameters %q, got %d %s", segs, w.Code, w.Body)
			}
			var want facilitator.AuthorizationKey
			want.Network, want.Asset, want.Payer = n, common.HexToAddress(a0), common.HexToAddress(fr)
			b, _ := hex.DecodeString(no[2:])
			copy(want.Nonce[:], b)
			if len(a.rec.keys) == 0 || a.rec.keys[0] != want {
				t.Fatalf("asked for %+v, want %+v", a.rec.keys, want)
			}
			if events {
				if ct := w.Header().Get("Content-Type"); ct != "text/event-stream" {
					t.Fatalf("Content-Type %q", ct)
				}
				wantAfter := int64(41) // the snapshot's: the settlement's last event
				if lastEventID != "" {
					wantAfter = after
				}
				if len(a.rec.after) != 1 || a.rec.after[0] != wantAfter {
					t.Fatalf("Last-Event-ID %q: events read after %v, want %d", lastEventID, a.rec.after, wantAfter)
				}
			}
			return
		}
		if len(a.rec.keys) != 0 || len(a.rec.after) != 0 {
			t.Fatalf("a refused request reached the fakes: %+v", a.rec)
		}
	})
}

// FuzzIDPath: the one-parameter routes (GET /v1/payments/{id}, /v1/settlements/{tx},
// /v1/events/payments/{id}, DELETE /v1/webhooks/{id}) reach the fakes exactly when the parameter
// has its documented form, with that parameter; otherwise they answer 400 with the documented
// reason (404 for a webhook id that is not one of ours).
func FuzzIDPath(f *testing.F) {
	for _, seed := range []struct {
		kind uint8
		seg  string
		raw  bool
	}{
		{0, "pay_0123456789abcdef", false}, {0, "pay_0123456789abcde", false}, {0, strings.Repeat("a", 129), false},
		{0, "pay_0123456789abcdef%00", true}, {0, "pay_0123456789abcdef/x", false}, {0, "pay_0123456789abcd%2F", true},
		{1, "0x" + strings.Repeat("ab", 32), false}, {1, "0X" + strings.Repeat("AB", 32), false}, {1, "0x" + strings.Repeat("ab", 31) + "a", false},
		{2, "pay_0123456789abcdef", false}, {2, "pay_0123456789abcdef\u00e9", false},
		{3, "wh_" + strings.Repeat("0f", 16), false}, {3, "wh_" + strings.Repeat("0F", 16), false}, {3, "", false},
	} {
		f.Add(seed.kind, seed.seg, seed.raw)
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, kind uint8, seg string, raw bool) {
		routes := []struct {
			method, prefix string
			valid          *regexp.Regexp
			ok, bad        int
			reason         string
		}{
			{http.MethodGet, "/v1/payments/", fuzzPayIDRE, http.StatusOK, http.StatusBadRequest, facilitator.ReasonInvalidPaymentIdentifier},
			{http.MethodGet, "/v1/settlements/", fuzzHash32RE, http.StatusOK, http.StatusBadRequest, "invalid_parameter"},
			{http.MethodGet, "/v1/events/payments/", fuzzPayIDRE, http.StatusOK, http.StatusBadRequest, facilitator.ReasonInvalidPaymentIdentifier},
			{http.MethodDelete, "/v1/webhooks/", fuzzWebhookRE, http.StatusNoContent, http.StatusNotFound, "not_found"},
		}
		r := routes[int(kind)%len(routes)]
		w, req, ok := a.serve(t, r.method, fuzzTarget(r.prefix, []string{seg}, raw), nil, nil)
		if !ok {
			return
		}
		if fuzzRefusedPath(t, a, w, req) {
			return
		}
		segs, ok := fuzzSegments(req, r.prefix)
		if !ok || len(segs) != 1 || segs[0] == "" {
			if w.Code != http.StatusNotFound && w.Code != http.StatusMethodNotAllowed && w.Code != r.bad {
				t.Fatalf("%s %q is not the route's shape, got %d %s", r.method, req.URL, w.Code, w.Body)
			}
			if len(a.rec.ids)+len(a.rec.txs)+len(a.rec.disabled) != 0 {
				t.Fatalf("%q reached the fakes: %+v", req.URL, a.rec)
			}
			return
		}
		p := fuzzParam(segs[0])
		reached := len(a.rec.ids) + len(a.rec.txs) + len(a.rec.disabled)
		if !r.valid.MatchString(p) {
			fuzzErrorBody(t, w, r.bad, r.reason)
			if reached != 0 {
				t.Fatalf("%q reached the fakes: %+v", p, a.rec)
			}
			return
		}
		if w.Code != r.ok || reached != 1 {
			t.Fatalf("%s %q: %d %s, %d calls", r.method, p, w.Code, w.Body, reached)
		}
		switch {
		case len(a.rec.ids) == 1 && a.rec.ids[0] != p,
			len(a.rec.txs) == 1 && a.rec.txs[0] != common.HexToHash(p),
			len(a.rec.disabled) == 1 && a.rec.disabled[0] != p:
			t.Fatalf("%q asked as %+v", p, a.rec)
		}
	})
}

// fuzzPublicHost is the registration rule: a name, or a public IP literal.
func fuzzPublicHost(host string) bool {
	h := strings.ToLower(host)
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return true // a name: checked again at dial time, once resolved
	}
	ip = ip.Unmap()
	return ip.IsGlobalUnicast() && !ip.IsPrivate() && !netip.MustParsePrefix("100.64.0.0/10").Contains(ip) &&
		!netip.MustParsePrefix("0.0.0.0/8").Contains(ip)
}

// FuzzWebhookRegistration: POST /v1/webhooks answers 201 or 400 invalid_webhook, never anything
// else; a body over 16 KiB or that is not the documented JSON never reaches the store; and what
// is stored is an absolute http(s) URL without credentials whose host, parsed again as the
// delivery client will, is a name or a public address, with distinct payTo addresses.
func FuzzWebhookRegistration(f *testing.F) {
	addr := "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
	for _, s := range []string{
		`{"url":"https://merchant.example/hooks/x402?token=abc","payTo":["` + addr + `"]}`,
		`{"url":"https://merchant.example/h","payTo":["` + addr + `","` + strings.ToLower(addr) + `"]}`,
		`{"url":"http://127.0.0.1:4021/","payTo":[]}`,
		`{"url":"http://[::ffff:10.0.0.1]/"}`,
		`{"url":"http://0x7f000001/"}`,
		`{"url":"http://2130706433/"}`,
		`{"url":"https://user:pw@merchant.example/"}`,
		`{"url":"https://merchant.example/h","url":"http://169.254.169.254/"}`,
		`{"URL":"https://merchant.example/h","PAYTO":null}`,
		`{"url":"https://merchant.example/\u0000"}`,
		`{"url":"http://[fe80::1%25en0]/"}`,
		`{"url":"http://merchant.example:99999/"}`,
		`{"url":"https://merchant.example/h","payTo":"` + addr + `"}`,
		`null`, `[]`, `"https://merchant.example/"`, ``, `{"url":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
	} {
		f.Add([]byte(s))
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		w, _, ok := a.serve(t, http.MethodPost, "/v1/webhooks", map[string]string{"Content-Type": "application/json"}, body)
		if !ok {
			t.Fatal("the request could not be built")
		}
		if w.Code != http.StatusCreated {
			fuzzErrorBody(t, w, http.StatusBadRequest, notify.ReasonInvalidWebhook)
			if len(a.rec.inserted) != 0 {
				t.Fatalf("refused, yet stored: %+v", a.rec.inserted)
			}
			return
		}
		if len(body) > 16<<10 {
			t.Fatalf("a %d-byte body was accepted", len(body))
		}
		if len(a.rec.inserted) != 1 {
			t.Fatalf("201 after %d inserts", len(a.rec.inserted))
		}
		stored := a.rec.inserted[0]
		if len(stored.URL) > 2048 { // the webhooks table's CHECK: the insert would fail, a 503
			t.Fatalf("stored a %d-character URL", len(stored.URL))
		}
		u, err := url.Parse(stored.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil || !fuzzPublicHost(u.Hostname()) {
			t.Fatalf("stored %q (parsed %+v, %v)", stored.URL, u, err)
		}
		seen := map[common.Address]bool{}
		for _, p := range stored.PayTo {
			if seen[p] {
				t.Fatalf("payTo %s twice", p)
			}
			seen[p] = true
		}
		var out struct {
			ID, Secret, URL string
			PayTo           []string
		}
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || !fuzzWebhookRE.MatchString(out.ID) || !fuzzSecretRE.MatchString(out.Secret) ||
			out.URL != stored.URL || len(out.PayTo) != len(stored.PayTo) || w.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("answer %s", w.Body)
		}
		for i, p := range out.PayTo {
			if p != stored.PayTo[i].Hex() {
				t.Fatalf("payTo %q answered, %s stored", p, stored.PayTo[i].Hex())
			}
		}
	})
}

// FuzzDeliveryBody: POST /v1/settlements/{tx}/delivery answers 201 or 400 (invalid_delivery, or
// for a malformed authorization the status routes' invalid_parameter and invalid_network), never
// anything else; a refused body never reaches the ledger; and what reaches it is a lowercase
// 0x-prefixed 32-byte digest, a printable media type of at most 255 characters (or none), a size
// of 0 or more (or none), and a well-formed authorization (or none), from a body of at most 4 KiB.
func FuzzDeliveryBody(f *testing.F) {
	digest := "0x" + strings.Repeat("ab", 32)
	auth := `{"network":"eip155:8453","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","from":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","nonce":"0x` + strings.Repeat("01", 32) + `"}`
	for _, s := range []string{
		`{"sha256":"` + digest + `"}`,
		`{"sha256":"` + strings.ToUpper(digest) + `","contentType":"application/json; charset=utf-8","size":123}`,
		`{"sha256":"` + digest + `","authorization":` + auth + `}`,
		`{"sha256":"` + digest + `","authorization":{"network":"base"}}`,
		`{"sha256":"` + digest + `","contentType":"json"}`,
		`{"sha256":"` + digest + `","contentType":" text/plain"}`,
		`{"sha256":"` + digest + `","contentType":"text/plain; charset=\"a\u00e9\""}`,
		`{"sha256":"` + digest + `","size":-1}`,
		`{"sha256":"` + digest + `","size":1e3}`,
		`{"sha256":"` + digest + `","size":9223372036854775808}`,
		`{"sha256":"` + digest + `","sha256":"0x12"}`,
		`{"SHA256":"` + digest + `"}`,
		`{"sha256":"` + digest + `"}{}`,
		`{"sha256":"0x12"}`, `null`, `[]`, ``, `{}`,
	} {
		f.Add([]byte(s))
	}
	a := newFuzzAPI(f)
	target := "/v1/settlements/0x" + strings.Repeat("cd", 32) + "/delivery"
	digestRE := regexp.MustCompile(`^0x[0-9a-f]{64}$`)
	f.Fuzz(func(t *testing.T, body []byte) {
		w, _, ok := a.serve(t, http.MethodPost, target, map[string]string{"Content-Type": "application/json"}, body)
		if !ok {
			t.Fatal("the request could not be built")
		}
		if w.Code != http.StatusCreated {
			var e map[string]string
			_ = json.Unmarshal(w.Body.Bytes(), &e)
			switch e["error"] {
			case facilitator.ReasonInvalidDelivery, "invalid_parameter", facilitator.ReasonInvalidNetwork:
				fuzzErrorBody(t, w, http.StatusBadRequest, e["error"])
			default:
				t.Fatalf("HTTP %d %s", w.Code, w.Body)
			}
			if len(a.rec.attached) != 0 {
				t.Fatalf("refused, yet recorded: %+v", a.rec.attached)
			}
			return
		}
		if len(body) > 4<<10 || len(a.rec.attached) != 1 {
			t.Fatalf("201 for a %d-byte body after %d records", len(body), len(a.rec.attached))
		}
		r := a.rec.attached[0].Record
		if !digestRE.MatchString(r.SHA256) || len(r.ContentType) > 255 || (r.Size != nil && *r.Size < 0) {
			t.Fatalf("recorded %+v", r)
		}
		for _, c := range []byte(r.ContentType) {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("recorded content type %q", r.ContentType)
			}
		}
		if k := a.rec.attached[0].Authorization; k != nil && !fuzzNetworkRE.MatchString(k.Network) {
			t.Fatalf("recorded authorization %+v", k)
		}
		var ans facilitator.DeliveryAnswer
		if err := json.Unmarshal(w.Body.Bytes(), &ans); err != nil || ans.Delivery.SHA256 != r.SHA256 {
			t.Fatalf("answer %s", w.Body)
		}
	})
}
