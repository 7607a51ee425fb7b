package api

// The OpenAPI document (openapi.json) is checked here against what the code does, so that it
// cannot drift: the routes New registers, the JSON fields of the Go types the bodies are made of,
// the statuses and headers the handlers answer (by probing a server built on fakes: no chain and
// no database), the path-parameter patterns, and the reason codes.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/metrics"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/ops"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// oasMirrors maps each schema that mirrors a Go type to that type. For the answers, required
// must list exactly the fields without omitempty; request schemas say what a client must send,
// which the decoder decides, so only their field names are compared.
var oasMirrors = []struct {
	schema   string
	typ      reflect.Type
	response bool
}{
	{"VerifyRequest", reflect.TypeFor[facilitator.Request](), false},
	{"PaymentPayload", reflect.TypeFor[facilitator.PaymentPayload](), false},
	{"PaymentRequirements", reflect.TypeFor[facilitator.PaymentRequirements](), false},
	{"ResourceInfo", reflect.TypeFor[facilitator.ResourceInfo](), false},
	{"PaymentPayloadV1", reflect.TypeFor[facilitator.PaymentPayloadV1](), false},
	{"PaymentRequirementsV1", reflect.TypeFor[facilitator.PaymentRequirementsV1](), false},
	{"ExactEVMPayload", reflect.TypeFor[facilitator.ExactEVMPayload](), false},
	{"ExactEVMAuthorization", reflect.TypeFor[facilitator.ExactEVMAuthorization](), false},
	{"VerifyResponse", reflect.TypeFor[facilitator.VerifyResponse](), true},
	{"SettleResponse", reflect.TypeFor[facilitator.SettleResponse](), true},
	{"SupportedResponse", reflect.TypeFor[facilitator.SupportedResponse](), true},
	{"SupportedKind", reflect.TypeFor[facilitator.SupportedKind](), true},
	{"AuthorizationStatus", reflect.TypeFor[facilitator.AuthorizationStatus](), true},
	{"StatusFinality", reflect.TypeFor[facilitator.StatusFinality](), true},
	{"Receipt", reflect.TypeFor[facilitator.Receipt](), true},
	{"DeliveryRecord", reflect.TypeFor[facilitator.DeliveryRecord](), true},
	{"Webhook", reflect.TypeFor[webhookJSON](), true},
	{"WebhookEvent", reflect.TypeFor[notify.Message](), true},
	{"SettlementItem", reflect.TypeFor[status.SettlementItem](), true},
	{"SettlementList", reflect.TypeFor[settlementsJSON](), true},
	{"Delivery", reflect.TypeFor[deliveryJSON](), true},
	{"DeliveryList", reflect.TypeFor[deliveriesJSON](), true},
	{"Redelivery", reflect.TypeFor[redeliveryJSON](), true},
	{"DeliveryRecord", reflect.TypeFor[facilitator.DeliveryRecord](), true},
	{"DeliveryRecordAnswer", reflect.TypeFor[facilitator.DeliveryAnswer](), true},
	{"DeliveryRecordRequest", reflect.TypeFor[facilitator.DeliveryRequest](), false},
	{"DeliveryAuthorization", reflect.TypeFor[facilitator.DeliveryAuthorization](), false},
	{"OpsOverview", reflect.TypeFor[ops.Snapshot](), true},
	{"OpsQuantiles", reflect.TypeFor[ops.Quantiles](), true},
	{"OpsSigner", reflect.TypeFor[ops.SignerRow](), true},
	{"OpsCheckRow", reflect.TypeFor[ops.CheckRow](), true},
}

var oasMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

func oasLoad(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	return doc
}

// oasGet walks doc along keys; nil when a key is missing.
func oasGet(node any, keys ...string) any {
	for _, k := range keys {
		m, ok := node.(map[string]any)
		if !ok {
			return nil
		}
		node = m[k]
	}
	return node
}

// oasDeref follows a local $ref ("#/components/…") to what it names.
func oasDeref(t *testing.T, doc map[string]any, node any) map[string]any {
	t.Helper()
	for range 10 {
		m, ok := node.(map[string]any)
		if !ok {
			t.Fatalf("not an object: %v", node)
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		target := oasGet(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
		if !strings.HasPrefix(ref, "#/") || target == nil {
			t.Fatalf("$ref %q names nothing in the document", ref)
		}
		node = target
	}
	t.Fatalf("$ref loop at %v", node)
	return nil
}

// oasOps lists the document's operations as "METHOD /path".
func oasOps(doc map[string]any) map[string]map[string]any {
	ops := map[string]map[string]any{}
	paths, _ := doc["paths"].(map[string]any)
	for p, item := range paths {
		for _, m := range oasMethods {
			if op, ok := oasGet(item, m).(map[string]any); ok {
				ops[strings.ToUpper(m)+" "+p] = op
			}
		}
	}
	return ops
}

var oasEchoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// oasPath turns an echo route path into its OpenAPI form: /v1/payments/:id → /v1/payments/{id}.
func oasPath(p string) string { return oasEchoParam.ReplaceAllString(p, "{$1}") }

// oasFakes is everything behind a server built for probing: each field decides one answer.
type oasFakes struct {
	verify       func(*facilitator.Payment) (facilitator.VerifyResponse, error)
	settle       func(*facilitator.Payment) (facilitator.SettleOutcome, error)
	status       facilitator.AuthorizationStatus
	found        bool  // Status.Authorization's found
	statusErr    error // every Status method's error
	notifyErr    error // every Notify method's error, before the dispatcher is asked
	storeFull    bool  // the webhook limit is reached
	noSettlement bool  // the ledger has no settlement for a stream
	keysDown     bool  // the API key store fails
	unready      bool  // a /readyz check fails
	limitErr     error // the read-only limit check /verify makes
	perKey       auth.Limit
	perClient    auth.Limit
	// deliveryErr is AttachDelivery's refusal; deliveryKept answers the record as already kept.
	deliveryErr  error
	deliveryKept bool
	perPublic    auth.Limit // the public view's own limit
}

// The lists: one settlement and one delivery, with a next page.
func (f *oasFakes) ListSettlements(context.Context, facilitator.Viewer, facilitator.SettlementFilter, facilitator.Page) (facilitator.SettlementPage, error) {
	if f.statusErr != nil {
		return facilitator.SettlementPage{}, f.statusErr
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := facilitator.ListedSettlement{Settlement: facilitator.Settlement{ID: 7, Key: facilitator.AuthorizationKey{Network: oasNetwork,
		Asset: common.HexToAddress(oasAsset), Payer: common.HexToAddress(oasFrom)}, PayTo: oasPayTo, Value: big.NewInt(10000),
		State: facilitator.StateMined, TxHash: common.HexToHash(oasTx), BlockNumber: 10, CreatedAt: at}, UpdatedAt: at}
	return facilitator.SettlementPage{Items: []facilitator.ListedSettlement{s}, Next: &facilitator.Cursor{At: at, ID: 7}}, nil
}

func (f *oasFakes) WebhookDeliveries(_ context.Context, _ facilitator.Viewer, id string, _ facilitator.Page) (facilitator.DeliveryPage, error) {
	if f.statusErr != nil {
		return facilitator.DeliveryPage{}, f.statusErr
	}
	if id != oasWebhookID {
		return facilitator.DeliveryPage{}, facilitator.ErrNotFound
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return facilitator.DeliveryPage{Webhook: facilitator.Webhook{ID: id, URL: "https://merchant.example/hook", PayTo: []common.Address{oasPayTo}, CreatedAt: at},
		Items: []facilitator.ListedDelivery{{Event: facilitator.SettlementEvent{ID: 41, State: facilitator.StateMined, At: at},
			Key:      facilitator.AuthorizationKey{Network: oasNetwork, Asset: common.HexToAddress(oasAsset), Payer: common.HexToAddress(oasFrom)},
			Attempts: 2, LastStatus: 500, LastError: "HTTP 500", CreatedAt: at, NextAttempt: &at}},
		Next: &facilitator.Cursor{ID: 41, At: at}}, nil
}

// RedeliverWebhook: event 41 of the webhook was given up, 42 delivered; nothing else exists.
func (f *oasFakes) RedeliverWebhook(_ context.Context, _ facilitator.Viewer, id string, event int64) (time.Time, error) {
	switch {
	case f.statusErr != nil:
		return time.Time{}, f.statusErr
	case id != oasWebhookID:
		return time.Time{}, facilitator.ErrNotFound
	case event == 41:
		return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), nil
	case event == 42:
		return time.Time{}, facilitator.ErrDeliveryNotGivenUp
	}
	return time.Time{}, facilitator.ErrNotFound
}

// AttachDelivery keeps the record for the status's authorization, or refuses it as set up.
func (f *oasFakes) AttachDelivery(_ context.Context, a facilitator.DeliveryAttachment) (facilitator.DeliveryCandidate, facilitator.DeliveryRecord, bool, error) {
	switch {
	case f.statusErr != nil:
		return facilitator.DeliveryCandidate{}, facilitator.DeliveryRecord{}, false, f.statusErr
	case f.deliveryErr != nil:
		return facilitator.DeliveryCandidate{}, facilitator.DeliveryRecord{}, false, f.deliveryErr
	case f.noSettlement:
		return facilitator.DeliveryCandidate{}, facilitator.DeliveryRecord{}, false, facilitator.ErrNotFound
	}
	key, err := status.ParseKey(oasNetwork, oasAsset, oasFrom, oasNonce)
	if err != nil {
		panic(err)
	}
	rec := a.Record
	rec.RecordedAt = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	return facilitator.DeliveryCandidate{ID: 42, Key: key, State: facilitator.StateMined}, rec, !f.deliveryKept, nil
}

func (f *oasFakes) CheckLimits(context.Context, *facilitator.Payment) error { return f.limitErr }

// oasAPIKey is an API key the probes send: the key text and its stored form.
type oasAPIKey struct {
	full string
	key  *facilitator.APIKey
}

func oasNewKey(scopes []facilitator.Scope, payTo []common.Address, revoked bool) oasAPIKey {
	full, id, hash, err := auth.Generate()
	if err != nil {
		panic(err)
	}
	k := &facilitator.APIKey{ID: id, Hash: hash, Name: "oas", Scopes: scopes, PayTo: payTo, CreatedAt: time.Now()}
	if revoked {
		k.RevokedAt = &k.CreatedAt
	}
	return oasAPIKey{full: full, key: k}
}

// oasPayTo is the payee of examples/verify-v2.json.
var oasPayTo = common.HexToAddress("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC")

// The keys the fake store holds, one for each case the middleware tells apart.
var (
	oasKeyAll     = oasNewKey(facilitator.AllScopes, nil, false)
	oasKeyRevoked = oasNewKey(facilitator.AllScopes, nil, true)
	oasKeyPayTo   = oasNewKey(facilitator.AllScopes, []common.Address{oasPayTo}, false)
	oasKeyOtherTo = oasNewKey(facilitator.AllScopes, []common.Address{common.HexToAddress(oasAsset)}, false)
	// oasKeyWithout[s] has every scope but s.
	oasKeyWithout = func() map[facilitator.Scope]oasAPIKey {
		out := map[facilitator.Scope]oasAPIKey{}
		for _, s := range facilitator.AllScopes {
			out[s] = oasNewKey(slices.DeleteFunc(slices.Clone(facilitator.AllScopes), func(x facilitator.Scope) bool { return x == s }), nil, false)
		}
		return out
	}()
	oasKeyUnknown = oasNewKey(facilitator.AllScopes, nil, false) // not in the store
)

// oasNoKey as a probe's key sends none.
const oasNoKey = "-"

// oasKeyStore is the API key store: the keys above but oasKeyUnknown.
type oasKeyStore struct{ f *oasFakes }

func (s oasKeyStore) APIKey(_ context.Context, id string) (*facilitator.APIKey, error) {
	if s.f.keysDown {
		return nil, errors.New("connection refused")
	}
	keys := []oasAPIKey{oasKeyAll, oasKeyRevoked, oasKeyPayTo, oasKeyOtherTo}
	for _, k := range oasKeyWithout {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if k.key.ID == id {
			return k.key, nil
		}
	}
	return nil, facilitator.ErrNotFound
}

func (f *oasFakes) Verify(_ context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error) {
	return f.verify(p)
}

func (f *oasFakes) Settle(_ context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	return f.settle(p)
}

func (f *oasFakes) ReleaseDelivery(context.Context, facilitator.SettleOutcome) error { return nil }
func (f *oasFakes) ConfirmDelivery(context.Context, facilitator.SettleOutcome) error { return nil }

func (f *oasFakes) Authorization(context.Context, facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	return f.status, f.found, f.statusErr
}

func (f *oasFakes) Payment(context.Context, string, string) (facilitator.AuthorizationStatus, error) {
	if !f.found && f.statusErr == nil {
		return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
	}
	return f.status, f.statusErr
}

// Settlement answers as for a batch's transaction: the status with the batch's settlements listed.
func (f *oasFakes) Settlement(ctx context.Context, _ common.Hash) (facilitator.AuthorizationStatus, error) {
	st, err := f.Payment(ctx, "", "")
	if err == nil {
		for _, state := range []string{facilitator.StatusSettled, facilitator.StatusExpired} {
			st.Batch = append(st.Batch, facilitator.BatchSettlement{Network: st.Network, Asset: st.Asset, Authorizer: st.Authorizer, Nonce: st.Nonce,
				State: state, Status: status.AuthorizationPath(st.Network, st.Asset, st.Authorizer, st.Nonce)})
		}
		st.Batch[1].Reason = facilitator.ReasonValidBefore
	}
	return st, err
}

// Public answers the public view of the status.
func (f *oasFakes) Public(context.Context, facilitator.AuthorizationKey) (facilitator.Receipt, bool, error) {
	return facilitator.PublicReceipt(f.status), f.found, f.statusErr
}

// PublicSettlement answers the public view of Settlement.
func (f *oasFakes) PublicSettlement(ctx context.Context, tx common.Hash) (facilitator.Receipt, error) {
	st, err := f.Settlement(ctx, tx)
	return facilitator.PublicReceipt(st), err
}

// PaymentIDsOf: the one payment id the status names.
func (f *oasFakes) PaymentIDsOf(context.Context, facilitator.AuthorizationKey, facilitator.Viewer) ([]string, error) {
	return []string{oasPayID}, f.statusErr
}

// oasNotify is the real notify.Dispatcher over oasStore, with errors injected in front of it.
type oasNotify struct {
	f *oasFakes
	d *notify.Dispatcher
}

func (n oasNotify) CreateWebhook(ctx context.Context, owner, url string, payTo []string) (facilitator.Webhook, error) {
	if n.f.notifyErr != nil {
		return facilitator.Webhook{}, n.f.notifyErr
	}
	return n.d.CreateWebhook(ctx, owner, url, payTo)
}

func (n oasNotify) Webhooks(ctx context.Context, owner string) ([]facilitator.Webhook, error) {
	if n.f.notifyErr != nil {
		return nil, n.f.notifyErr
	}
	return n.d.Webhooks(ctx, owner)
}

func (n oasNotify) DisableWebhook(ctx context.Context, owner, id string) error {
	if n.f.notifyErr != nil {
		return n.f.notifyErr
	}
	return n.d.DisableWebhook(ctx, owner, id)
}

func (n oasNotify) OpenStream(ctx context.Context, t notify.Target, lastEventID string) (*notify.Stream, error) {
	if n.f.notifyErr != nil {
		return nil, n.f.notifyErr
	}
	return n.d.OpenStream(ctx, t, lastEventID)
}

const oasWebhookID = "wh_0123456789abcdef0123456789abcdef"

// oasStore is a ledger holding one webhook and one mined settlement with events 41 and 42.
type oasStore struct {
	f    *oasFakes
	mu   sync.Mutex
	sent bool
}

func (s *oasStore) InsertWebhook(_ context.Context, w *facilitator.Webhook, _ int) (bool, error) {
	w.CreatedAt = time.Now()
	return !s.f.storeFull, nil
}

func (s *oasStore) Webhooks(context.Context, string) ([]facilitator.Webhook, error) {
	return []facilitator.Webhook{{ID: oasWebhookID, URL: "https://merchant.example/hook", Secret: "kept-secret",
		PayTo: []common.Address{common.HexToAddress(oasAsset)}, CreatedAt: time.Now()}}, nil
}

func (s *oasStore) DisableWebhook(_ context.Context, _, id string) error {
	if id != oasWebhookID {
		return facilitator.ErrNotFound
	}
	return nil
}

func (s *oasStore) EnqueueWebhookEvents(context.Context, []string, int) (bool, error) {
	return false, nil
}

func (s *oasStore) ClaimWebhookDeliveries(context.Context, facilitator.DeliveryClaim) ([]facilitator.WebhookDelivery, error) {
	return nil, nil
}

func (s *oasStore) RecordWebhookAttempt(context.Context, facilitator.DeliveryAttempt) error {
	return nil
}

func (s *oasStore) PruneWebhookDeliveries(context.Context, time.Time, int) (int64, error) {
	return 0, nil
}

func (s *oasStore) settlement(key facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	if s.f.noSettlement {
		return nil, facilitator.ErrNotFound
	}
	return &facilitator.Settlement{ID: 7, Key: key, State: facilitator.StateMined}, nil
}

func (s *oasStore) SettlementByKey(_ context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	return s.settlement(key)
}

func (s *oasStore) PaymentID(_ context.Context, scope, id string) (*facilitator.PaymentIDRecord, error) {
	st, err := s.settlement(facilitator.AuthorizationKey{Network: oasNetwork})
	if err != nil {
		return nil, err
	}
	return &facilitator.PaymentIDRecord{Scope: scope, ID: id, Settlement: st}, nil
}

func (s *oasStore) SettlementEvents(_ context.Context, settlementID, after int64, _ []string, _ int) ([]facilitator.SettlementEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent || after >= 42 {
		return nil, nil
	}
	s.sent = true
	return []facilitator.SettlementEvent{{ID: 42, SettlementID: settlementID, State: facilitator.StateMined, At: time.Now()}}, nil
}

func (s *oasStore) LastSettlementEvent(context.Context, int64) (int64, error) { return 41, nil }

const (
	oasNetwork = "eip155:8453"
	oasAsset   = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
	oasFrom    = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
	oasNonce   = "0x27aab29cb5d9d2167e08ed05f75471bf1a11741a20850b8cfd4c4295578062f6"
	oasTx      = "0x8f1b3c9a4d2e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
	oasPayID   = "order-1234567890abcdef"
)

// oasConsole stands in for the console, whose pages are not part of the document.
type oasConsole struct{}

func (oasConsole) ServeConsole(w http.ResponseWriter, _ *http.Request, _ string) {
	w.WriteHeader(http.StatusOK)
}

func (oasConsole) Refused(w http.ResponseWriter, _ *http.Request, _ error) {
	w.WriteHeader(http.StatusUnauthorized)
}

func (oasConsole) ServeReceipt(w http.ResponseWriter, _ *http.Request, _ facilitator.Receipt, found bool) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if !found {
		w.WriteHeader(http.StatusNotFound)
	}
	io.WriteString(w, "<!doctype html><title>Receipt</title>")
}

func (oasConsole) ReceiptError(w http.ResponseWriter, _ *http.Request, err error) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(HTTPStatus(err))
	io.WriteString(w, "<!doctype html><title>Error</title>")
}

// oasOverview stands in for the operations overview: the real one over an empty ledger and one signer.
type oasOverview struct{}

func (oasOverview) Overview(ctx context.Context) ops.Snapshot {
	return ops.New(ops.Config{Ledger: oasOverviewLedger{}, Engine: oasOverviewLedger{}}).Overview(ctx)
}

func (oasOverviewLedger) Signers() []settle.SignerHealth {
	next := uint64(7)
	return []settle.SignerHealth{{Network: oasNetwork, Address: common.HexToAddress(oasFrom), Balance: big.NewInt(1e18),
		BalanceReadAt: time.Now(), Leased: true, NextNonce: &next}}
}

type oasOverviewLedger struct{}

func (oasOverviewLedger) SettlementsPerMinute(context.Context, time.Time) ([]facilitator.MinuteCount, error) {
	return []facilitator.MinuteCount{{Minute: time.Now().Truncate(time.Minute), State: facilitator.StateFinal, Count: 2}}, nil
}
func (oasOverviewLedger) SettlementTimes(context.Context, time.Time) (facilitator.SettlementTimes, error) {
	return facilitator.SettlementTimes{}, nil
}
func (oasOverviewLedger) WebhookDeliveryCounts(context.Context, time.Time) (facilitator.DeliveryCounts, error) {
	return facilitator.DeliveryCounts{ByStatusClass: map[string]int{}}, nil
}
func (oasOverviewLedger) ReconcileRuns(context.Context, int) ([]facilitator.ReconcileRun, error) {
	return nil, nil
}
func (oasOverviewLedger) RecentSettled(context.Context, int) ([]facilitator.Settlement, error) {
	return nil, nil
}

// oasServer builds the server with every optional route group on, over fakes.
func oasServer(t *testing.T, f *oasFakes) *Server {
	t.Helper()
	d := notify.New(notify.Config{Store: &oasStore{f: f}, Status: f, StreamPoll: 10 * time.Millisecond,
		KeepAlive: time.Hour, StreamLifetime: 300 * time.Millisecond})
	t.Cleanup(d.Stop)
	m := metrics.New()
	cfg := Config{
		Observer: m, Metrics: m.Handler(),
		Ready: map[string]ReadyChecker{"postgres": ReadyFunc(func(context.Context) error {
			if f.unready {
				return errors.New("closed pool")
			}
			return nil
		})},
		ReadyEndpoints: func() map[string]string {
			return map[string]string{"eip155:84532/rpc0": "ok, head 12", "eip155:84532/rpc1": "down: rate limited"}
		},
		ReadySigners: func() map[string]string {
			return map[string]string{"eip155:84532/0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266": "down: remote signer http://127.0.0.1:8550: account_signTransaction: connection refused"}
		},
		Verifier: f, Settler: f, Status: f, Notify: oasNotify{f: f, d: d}, Limits: f, Lists: f, Redeliver: f, Deliveries: f,
		Console: oasConsole{}, Ops: oasOverview{}, Logger: slog.New(slog.DiscardHandler), Now: time.Now,
		Receipts: f, ReceiptPage: oasConsole{}, PaymentIDs: f, PublicPerClient: f.perPublic,
		Auth: &AuthConfig{Mode: AuthKeys, Keys: oasKeyStore{f: f}, PerKey: f.perKey, PerClient: f.perClient},
		// A proxy the test's requests never come from: their client is their peer.
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		Supported: facilitator.SupportedResponse{
			Kinds: []facilitator.SupportedKind{
				{X402Version: 2, Scheme: "exact", Network: oasNetwork},
				{X402Version: 1, Scheme: "exact", Network: "base"},
			},
			Extensions: []string{},
			Signers:    map[string][]string{"eip155:*": {oasFrom}},
		},
	}
	// A nil dependency may leave its routes out (New registers /settle only with a Settler, …):
	// every one is set, so that every route is registered and checked.
	cv := reflect.ValueOf(cfg)
	for i := range cv.NumField() {
		switch fv := cv.Field(i); fv.Kind() {
		case reflect.Interface, reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan:
			if fv.IsNil() {
				t.Fatalf("api.Config.%s is nil in the OpenAPI test server: set it, so that the routes it enables are checked", cv.Type().Field(i).Name)
			}
		}
	}
	return New(cfg)
}

func oasDefaultFakes() *oasFakes {
	st := facilitator.AuthorizationStatus{State: facilitator.StatusSettled, Network: oasNetwork, Asset: oasAsset,
		Authorizer: oasFrom, Nonce: oasNonce, Transaction: oasTx, BlockNumber: 10, Confirmations: 3, SettledBy: "facilitator",
		To: oasAsset, Value: "10000", ValidBefore: "4102444800", PaymentID: oasPayID, Basis: "ledger", IndexedHead: 12, Head: 12,
		Finality: facilitator.StatusFinality{Rule: "tag:finalized", FinalBlock: 10}}
	return &oasFakes{
		verify: func(p *facilitator.Payment) (facilitator.VerifyResponse, error) {
			return facilitator.VerifyResponse{IsValid: true, Payer: p.Payer}, nil
		},
		settle: func(p *facilitator.Payment) (facilitator.SettleOutcome, error) {
			return facilitator.SettleOutcome{Response: facilitator.SettleResponse{Success: true, Payer: p.Payer, Transaction: oasTx, Network: p.Network}}, nil
		},
		status: st,
		found:  true,
	}
}

// oasProbe is one request to a server on fakes, and the status it must get.
type oasProbe struct {
	name   string
	method string
	url    string
	route  string // the OpenAPI path
	header map[string]string
	body   string
	setup  func(f *oasFakes)
	status int
	// key is the API key sent as Authorization: Bearer; "" sends oasKeyAll, oasNoKey none.
	key string
	// before is how many times the request is sent first (to use up a rate limit).
	before int
}

func oasProbes(t *testing.T) []oasProbe {
	t.Helper()
	example, err := os.ReadFile("../examples/verify-v2.json")
	if err != nil {
		t.Fatal(err)
	}
	pay := string(example)
	var (
		authRoute   = "/v1/authorizations/{network}/{asset}/{from}/{nonce}"
		authURL     = "/v1/authorizations/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/" + oasNonce
		eventsRoute = "/v1/events/authorizations/{network}/{asset}/{from}/{nonce}"
		eventsURL   = "/v1/events/authorizations/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/" + oasNonce
		// The receipt page: open in every mode, so no refusal probes.
		receiptRoute = "/r/{network}/{asset}/{from}/{nonce}"
		receiptURL   = "/r/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/" + oasNonce
	)
	unavailable := func(reason string) func(*oasFakes) {
		return func(f *oasFakes) {
			err := facilitator.Unavailable(reason, "a dependency is unavailable, retry", errors.New("connection refused"))
			f.statusErr, f.notifyErr = err, err
			f.verify = func(*facilitator.Payment) (facilitator.VerifyResponse, error) {
				return facilitator.VerifyResponse{}, err
			}
			f.settle = func(*facilitator.Payment) (facilitator.SettleOutcome, error) { return facilitator.SettleOutcome{}, err }
		}
	}
	internal := func(f *oasFakes) {
		err := errors.New("a bug")
		f.statusErr, f.notifyErr = err, err
		f.verify = func(*facilitator.Payment) (facilitator.VerifyResponse, error) {
			return facilitator.VerifyResponse{}, err
		}
		f.settle = func(*facilitator.Payment) (facilitator.SettleOutcome, error) { return facilitator.SettleOutcome{}, err }
	}
	panics := func(f *oasFakes) {
		f.verify = func(*facilitator.Payment) (facilitator.VerifyResponse, error) { panic("a bug") }
		f.settle = func(*facilitator.Payment) (facilitator.SettleOutcome, error) { panic("a bug") }
	}
	conflict := func(f *oasFakes) {
		err := &facilitator.Error{Code: facilitator.EConflict, Reason: facilitator.ReasonPaymentIdentifierConflict,
			Message: "the payment identifier is bound to another payment"}
		f.verify = func(*facilitator.Payment) (facilitator.VerifyResponse, error) {
			return facilitator.VerifyResponse{}, err
		}
		f.settle = func(*facilitator.Payment) (facilitator.SettleOutcome, error) { return facilitator.SettleOutcome{}, err }
	}
	replay := func(f *oasFakes) {
		f.verify = func(p *facilitator.Payment) (facilitator.VerifyResponse, error) {
			return facilitator.VerifyResponse{IsValid: true, Payer: p.Payer, Extensions: facilitator.ReplayInfo(oasPayID)}, nil
		}
		f.settle = func(p *facilitator.Payment) (facilitator.SettleOutcome, error) {
			return facilitator.SettleOutcome{Response: facilitator.SettleResponse{Success: true, Payer: p.Payer, Transaction: oasTx,
				Network: p.Network, Extensions: facilitator.ReplayInfo(oasPayID)}}, nil
		}
	}
	limited := func(reason string) func(*oasFakes) {
		return func(f *oasFakes) {
			err := &facilitator.Error{Code: facilitator.ELimited, Reason: reason, Message: "a limit refuses it for now", RetryAfter: time.Minute}
			f.limitErr = err // /verify: a valid verdict, then the limit check
			f.settle = func(*facilitator.Payment) (facilitator.SettleOutcome, error) { return facilitator.SettleOutcome{}, err }
		}
	}
	notFound := func(f *oasFakes) { f.found, f.noSettlement = false, true }
	refused := func(code facilitator.Code, reason string) func(*oasFakes) {
		return func(f *oasFakes) { f.deliveryErr = facilitator.Errorf(code, reason, "refused") }
	}
	const (
		deliveryRoute = "/v1/settlements/{tx}/delivery"
		deliveryURL   = "/v1/settlements/" + oasTx + "/delivery"
		deliveryRec   = `{"sha256": "0x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "contentType": "application/json", "size": 57, "authorization": {"network": "` + oasNetwork + `", "asset": "` + oasAsset + `", "from": "` + oasFrom + `", "nonce": "` + oasNonce + `"}}`
	)
	probes := []oasProbe{
		{name: "verify valid", method: "POST", url: "/verify", body: pay, status: 200},
		{name: "verify invalid", method: "POST", url: "/verify", body: pay, status: 200, setup: func(f *oasFakes) {
			f.verify = func(p *facilitator.Payment) (facilitator.VerifyResponse, error) {
				return facilitator.VerifyResponse{InvalidReason: facilitator.ReasonInsufficientBalance, InvalidMessage: "balance", Payer: p.Payer}, nil
			}
		}},
		{name: "verify replay", method: "POST", url: "/verify", body: pay, status: 200, setup: replay},
		{name: "verify malformed", method: "POST", url: "/verify", body: "{", status: 400},
		{name: "verify v3", method: "POST", url: "/verify", body: `{"paymentPayload":{"x402Version":3},"paymentRequirements":{}}`, status: 400},
		{name: "verify conflict", method: "POST", url: "/verify", body: pay, status: 409, setup: conflict},
		{name: "verify unavailable", method: "POST", url: "/verify", body: pay, status: 503, setup: unavailable(facilitator.ReasonUnexpectedVerifyError)},
		{name: "verify wallet cap", method: "POST", url: "/verify", body: pay, status: 429, setup: limited(facilitator.ReasonWalletCapExceeded)},
		{name: "verify internal", method: "POST", url: "/verify", body: pay, status: 500, setup: internal},
		{name: "verify panic", method: "POST", url: "/verify", body: pay, status: 500, setup: panics},

		{name: "settle success", method: "POST", url: "/settle", body: pay, status: 200},
		{name: "settle pending", method: "POST", url: "/settle", body: pay, status: 200, setup: func(f *oasFakes) {
			f.settle = func(p *facilitator.Payment) (facilitator.SettleOutcome, error) {
				return facilitator.SettleOutcome{Response: facilitator.SettleResponse{ErrorReason: facilitator.ReasonSettlementPending,
					Payer: p.Payer, Transaction: oasTx, Network: p.Network}}, nil
			}
		}},
		{name: "settle replay", method: "POST", url: "/settle", body: pay, status: 200, setup: replay},
		{name: "settle malformed", method: "POST", url: "/settle", body: `{"paymentPayload": null}`, status: 400},
		{name: "settle conflict", method: "POST", url: "/settle", body: pay, status: 409, setup: conflict},
		{name: "settle busy", method: "POST", url: "/settle", body: pay, status: 503, setup: unavailable(facilitator.ReasonSettlerBusy)},
		{name: "settle unfunded signers", method: "POST", url: "/settle", body: pay, status: 503, setup: unavailable(facilitator.ReasonInsufficientSignerFunds)},
		{name: "settle wallet cap", method: "POST", url: "/settle", body: pay, status: 429, setup: limited(facilitator.ReasonWalletCapExceeded)},
		{name: "settle gas budget", method: "POST", url: "/settle", body: pay, status: 429, setup: limited(facilitator.ReasonGasBudgetExceeded)},
		{name: "settle internal", method: "POST", url: "/settle", body: pay, status: 500, setup: internal},
		{name: "settle panic", method: "POST", url: "/settle", body: pay, status: 500, setup: panics},

		{name: "supported", method: "GET", url: "/supported", status: 200, key: oasNoKey},
		{name: "healthz", method: "GET", url: "/healthz", status: 200, key: oasNoKey},
		{name: "openapi", method: "GET", url: "/openapi.json", status: 200, key: oasNoKey},
		{name: "readyz", method: "GET", url: "/readyz", status: 200, key: oasNoKey},
		{name: "readyz unready", method: "GET", url: "/readyz", status: 503, key: oasNoKey, setup: func(f *oasFakes) { f.unready = true }},
		{name: "metrics", method: "GET", url: "/metrics", status: 200, key: oasNoKey},
		{name: "supported with a key", method: "GET", url: "/supported", status: 200},

		{name: "authorization", method: "GET", url: authURL, route: authRoute, status: 200},
		{name: "authorization unseen", method: "GET", url: authURL, route: authRoute, status: 404, setup: func(f *oasFakes) {
			f.found = false
			f.status = facilitator.AuthorizationStatus{State: facilitator.StatusUnused, Network: oasNetwork, Asset: oasAsset,
				Authorizer: oasFrom, Nonce: oasNonce, Basis: "chain", IndexedHead: 12, Head: 12, Finality: facilitator.StatusFinality{Rule: "depth:12"}}
		}},
		{name: "authorization bad network", method: "GET", url: "/v1/authorizations/base/" + oasAsset + "/" + oasFrom + "/" + oasNonce, route: authRoute, status: 400},
		{name: "authorization bad asset", method: "GET", url: "/v1/authorizations/" + oasNetwork + "/0x12/" + oasFrom + "/" + oasNonce, route: authRoute, status: 400},
		{name: "authorization bad nonce", method: "GET", url: "/v1/authorizations/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/0x12", route: authRoute, status: 400},
		{name: "authorization unavailable", method: "GET", url: authURL, route: authRoute, status: 503, setup: unavailable("status_unavailable")},
		{name: "authorization internal", method: "GET", url: authURL, route: authRoute, status: 500, setup: internal},

		// Without any credential: the public view, under its own per-client limit.
		{name: "authorization public", method: "GET", url: authURL, route: authRoute, status: 200, key: oasNoKey},
		{name: "authorization public unseen", method: "GET", url: authURL, route: authRoute, status: 404, key: oasNoKey, setup: func(f *oasFakes) {
			f.found = false
			f.status = facilitator.AuthorizationStatus{State: facilitator.StatusUnused, Network: oasNetwork, Asset: oasAsset,
				Authorizer: oasFrom, Nonce: oasNonce, Basis: "chain", IndexedHead: 12, Head: 12, Finality: facilitator.StatusFinality{Rule: "depth:12"}}
		}},
		{name: "authorization public rate limited", method: "GET", url: authURL, route: authRoute, status: 429, key: oasNoKey, before: 1,
			setup: func(f *oasFakes) { f.perPublic = auth.Limit{Rate: 0.01, Burst: 1} }},
		{name: "authorization public unavailable", method: "GET", url: authURL, route: authRoute, status: 503, key: oasNoKey, setup: unavailable("status_unavailable")},
		{name: "settlement public", method: "GET", url: "/v1/settlements/" + oasTx, route: "/v1/settlements/{tx}", status: 200, key: oasNoKey},
		{name: "settlement public unknown", method: "GET", url: "/v1/settlements/" + oasTx, route: "/v1/settlements/{tx}", status: 404, key: oasNoKey, setup: notFound},

		{name: "receipt page", method: "GET", url: receiptURL, route: receiptRoute, status: 200, key: oasNoKey},
		{name: "receipt JSON", method: "GET", url: receiptURL + ".json", route: receiptRoute, status: 200, key: oasNoKey},
		{name: "receipt JSON by Accept", method: "GET", url: receiptURL, route: receiptRoute, status: 200, key: oasNoKey, header: map[string]string{"Accept": "application/json"}},
		{name: "receipt page unseen", method: "GET", url: receiptURL, route: receiptRoute, status: 404, key: oasNoKey, setup: notFound},
		{name: "receipt JSON unseen", method: "GET", url: receiptURL + ".json", route: receiptRoute, status: 404, key: oasNoKey, setup: notFound},
		{name: "receipt bad nonce", method: "GET", url: "/r/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/0x12.json", route: receiptRoute, status: 400, key: oasNoKey},
		{name: "receipt rate limited", method: "GET", url: receiptURL + ".json", route: receiptRoute, status: 429, key: oasNoKey, before: 1,
			setup: func(f *oasFakes) { f.perPublic = auth.Limit{Rate: 0.01, Burst: 1} }},
		{name: "receipt unavailable", method: "GET", url: receiptURL + ".json", route: receiptRoute, status: 503, key: oasNoKey, setup: unavailable("status_unavailable")},
		{name: "receipt internal", method: "GET", url: receiptURL + ".json", route: receiptRoute, status: 500, key: oasNoKey, setup: internal},

		{name: "payment", method: "GET", url: "/v1/payments/" + oasPayID, route: "/v1/payments/{id}", status: 200},
		{name: "payment bad id", method: "GET", url: "/v1/payments/short", route: "/v1/payments/{id}", status: 400},
		{name: "payment unknown", method: "GET", url: "/v1/payments/" + oasPayID, route: "/v1/payments/{id}", status: 404, setup: notFound},
		{name: "payment unavailable", method: "GET", url: "/v1/payments/" + oasPayID, route: "/v1/payments/{id}", status: 503, setup: unavailable("status_unavailable")},
		{name: "payment internal", method: "GET", url: "/v1/payments/" + oasPayID, route: "/v1/payments/{id}", status: 500, setup: internal},

		{name: "settlement", method: "GET", url: "/v1/settlements/" + oasTx, route: "/v1/settlements/{tx}", status: 200},
		{name: "settlement bad hash", method: "GET", url: "/v1/settlements/0x12", route: "/v1/settlements/{tx}", status: 400},
		{name: "settlement unknown", method: "GET", url: "/v1/settlements/" + oasTx, route: "/v1/settlements/{tx}", status: 404, setup: notFound},
		{name: "settlement unavailable", method: "GET", url: "/v1/settlements/" + oasTx, route: "/v1/settlements/{tx}", status: 503, setup: unavailable("status_unavailable")},
		{name: "settlement internal", method: "GET", url: "/v1/settlements/" + oasTx, route: "/v1/settlements/{tx}", status: 500, setup: internal},

		{name: "attach delivery", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 201},
		{name: "attach delivery again", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 200, setup: func(f *oasFakes) { f.deliveryKept = true }},
		{name: "attach delivery malformed", method: "POST", url: deliveryURL, route: deliveryRoute, body: `{"sha256": "0x12"}`, status: 400},
		{name: "attach delivery bad hash", method: "POST", url: "/v1/settlements/0x12/delivery", route: deliveryRoute, body: deliveryRec, status: 400},
		{name: "attach delivery unknown", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 404, setup: notFound},
		{name: "attach delivery another key's", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 403, setup: refused(facilitator.EForbidden, facilitator.ReasonNotSettlingKey)},
		{name: "attach delivery pending", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 409, setup: refused(facilitator.EConflict, facilitator.ReasonSettlementPending)},
		{name: "attach delivery failed", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 409, setup: refused(facilitator.EConflict, facilitator.ReasonSettlementNotSucceeded)},
		{name: "attach delivery conflict", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 409, setup: refused(facilitator.EConflict, facilitator.ReasonDeliveryConflict)},
		{name: "attach delivery unavailable", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 503, setup: unavailable("ledger_unavailable")},
		// An untyped failure of the ledger is a ledger not answering: 503, the same record may be sent again.
		{name: "attach delivery ledger error", method: "POST", url: deliveryURL, route: deliveryRoute, body: deliveryRec, status: 503, setup: internal},

		{name: "create webhook", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook", "payTo": ["` + oasAsset + `"]}`, status: 201},
		{name: "create webhook malformed", method: "POST", url: "/v1/webhooks", body: `{"url": 1}`, status: 400},
		// With a key, a webhook names its payees, within the key's allow-list.
		{name: "create webhook without payTo", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook"}`, status: 403},
		{name: "create webhook payTo not allowed", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook", "payTo": ["` + oasAsset + `"]}`, key: oasKeyPayTo.full, status: 403},
		{name: "create webhook payTo allowed", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook", "payTo": ["` + oasPayTo.Hex() + `"]}`, key: oasKeyPayTo.full, status: 201},
		{name: "create webhook private", method: "POST", url: "/v1/webhooks", body: `{"url": "http://127.0.0.1/hook", "payTo": ["` + oasAsset + `"]}`, status: 400},
		{name: "create webhook full", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook", "payTo": ["` + oasAsset + `"]}`, status: 409, setup: func(f *oasFakes) { f.storeFull = true }},
		{name: "create webhook unavailable", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook", "payTo": ["` + oasAsset + `"]}`, status: 503, setup: unavailable("webhooks_unavailable")},
		{name: "create webhook internal", method: "POST", url: "/v1/webhooks", body: `{"url": "https://merchant.example/hook", "payTo": ["` + oasAsset + `"]}`, status: 500, setup: internal},
		{name: "list webhooks", method: "GET", url: "/v1/webhooks", status: 200},
		{name: "list webhooks unavailable", method: "GET", url: "/v1/webhooks", status: 503, setup: unavailable("webhooks_unavailable")},
		{name: "list webhooks internal", method: "GET", url: "/v1/webhooks", status: 500, setup: internal},
		{name: "delete webhook", method: "DELETE", url: "/v1/webhooks/" + oasWebhookID, route: "/v1/webhooks/{id}", status: 204},
		{name: "delete webhook unknown", method: "DELETE", url: "/v1/webhooks/wh_nope", route: "/v1/webhooks/{id}", status: 404},
		{name: "delete webhook unavailable", method: "DELETE", url: "/v1/webhooks/" + oasWebhookID, route: "/v1/webhooks/{id}", status: 503, setup: unavailable("webhooks_unavailable")},
		{name: "delete webhook internal", method: "DELETE", url: "/v1/webhooks/" + oasWebhookID, route: "/v1/webhooks/{id}", status: 500, setup: internal},

		{name: "list settlements", method: "GET", url: "/v1/settlements?state=pending,mined&payee=" + oasAsset + "&since=2026-01-01T00:00:00Z&limit=10", route: "/v1/settlements", status: 200},
		{name: "list settlements bad state", method: "GET", url: "/v1/settlements?state=done", route: "/v1/settlements", status: 400},
		{name: "list settlements bad network", method: "GET", url: "/v1/settlements?network=base", route: "/v1/settlements", status: 400},
		{name: "list settlements unavailable", method: "GET", url: "/v1/settlements", route: "/v1/settlements", status: 503, setup: internal},
		{name: "export settlements", method: "GET", url: "/v1/settlements.csv?state=settled", route: "/v1/settlements.csv", status: 200},
		{name: "export settlements with a cursor", method: "GET", url: "/v1/settlements.csv?cursor=abc", route: "/v1/settlements.csv", status: 400},
		{name: "export settlements unavailable", method: "GET", url: "/v1/settlements.csv", route: "/v1/settlements.csv", status: 503, setup: unavailable("status_unavailable")},
		{name: "webhook deliveries", method: "GET", url: "/v1/webhooks/" + oasWebhookID + "/deliveries?limit=5", route: "/v1/webhooks/{id}/deliveries", status: 200},
		{name: "webhook deliveries bad limit", method: "GET", url: "/v1/webhooks/" + oasWebhookID + "/deliveries?limit=501", route: "/v1/webhooks/{id}/deliveries", status: 400},
		{name: "webhook deliveries unknown", method: "GET", url: "/v1/webhooks/wh_nope/deliveries", route: "/v1/webhooks/{id}/deliveries", status: 404},
		{name: "redeliver", method: "POST", url: "/v1/webhooks/" + oasWebhookID + "/deliveries/41/redeliver", route: "/v1/webhooks/{id}/deliveries/{eventId}/redeliver", status: 202},
		{name: "redeliver unknown event", method: "POST", url: "/v1/webhooks/" + oasWebhookID + "/deliveries/40/redeliver", route: "/v1/webhooks/{id}/deliveries/{eventId}/redeliver", status: 404},
		{name: "redeliver not given up", method: "POST", url: "/v1/webhooks/" + oasWebhookID + "/deliveries/42/redeliver", route: "/v1/webhooks/{id}/deliveries/{eventId}/redeliver", status: 409},
		{name: "redeliver unavailable", method: "POST", url: "/v1/webhooks/" + oasWebhookID + "/deliveries/41/redeliver", route: "/v1/webhooks/{id}/deliveries/{eventId}/redeliver", status: 503, setup: unavailable("webhooks_unavailable")},
		{name: "webhook deliveries unavailable", method: "GET", url: "/v1/webhooks/" + oasWebhookID + "/deliveries", route: "/v1/webhooks/{id}/deliveries", status: 503, setup: unavailable("status_unavailable")},
		{name: "ops overview", method: "GET", url: "/v1/ops/overview", status: 200},

		{name: "authorization events", method: "GET", url: eventsURL, route: eventsRoute, status: 200},
		{name: "authorization events bad network", method: "GET", url: "/v1/events/authorizations/base/" + oasAsset + "/" + oasFrom + "/" + oasNonce, route: eventsRoute, status: 400},
		{name: "authorization events bad from", method: "GET", url: "/v1/events/authorizations/" + oasNetwork + "/" + oasAsset + "/nope/" + oasNonce, route: eventsRoute, status: 400},
		{name: "authorization events bad nonce", method: "GET", url: "/v1/events/authorizations/" + oasNetwork + "/" + oasAsset + "/" + oasFrom + "/0x1", route: eventsRoute, status: 400},
		{name: "authorization events bad Last-Event-ID", method: "GET", url: eventsURL, route: eventsRoute, header: map[string]string{"Last-Event-ID": "abc"}, status: 400},
		{name: "authorization events unknown", method: "GET", url: eventsURL, route: eventsRoute, status: 404, setup: notFound},
		{name: "authorization events too many", method: "GET", url: eventsURL, route: eventsRoute, status: 503, setup: unavailable(facilitator.ReasonTooManyStreams)},
		{name: "authorization events too many for the key", method: "GET", url: eventsURL, route: eventsRoute, status: 429, setup: func(f *oasFakes) {
			f.notifyErr = &facilitator.Error{Code: facilitator.ELimited, Reason: facilitator.ReasonTooManyStreamsForKey, Message: "close one", RetryAfter: 5 * time.Second}
		}},
		{name: "authorization events internal", method: "GET", url: eventsURL, route: eventsRoute, status: 500, setup: internal},
		{name: "payment events", method: "GET", url: "/v1/events/payments/" + oasPayID, route: "/v1/events/payments/{id}", status: 200},
		{name: "payment events resumed", method: "GET", url: "/v1/events/payments/" + oasPayID, route: "/v1/events/payments/{id}", header: map[string]string{"Last-Event-ID": "41"}, status: 200},
		{name: "payment events bad id", method: "GET", url: "/v1/events/payments/short", route: "/v1/events/payments/{id}", status: 400},
		{name: "payment events unknown", method: "GET", url: "/v1/events/payments/" + oasPayID, route: "/v1/events/payments/{id}", status: 404, setup: notFound},
		{name: "payment events unavailable", method: "GET", url: "/v1/events/payments/" + oasPayID, route: "/v1/events/payments/{id}", status: 503, setup: unavailable("notifications_unavailable")},
		{name: "payment events internal", method: "GET", url: "/v1/events/payments/" + oasPayID, route: "/v1/events/payments/{id}", status: 500, setup: internal},
	}
	for i := range probes {
		if probes[i].route == "" {
			probes[i].route = probes[i].url
		}
	}
	// The guard's refusals, on every route that needs a key, each built on the route's first
	// probe that succeeds.
	done := map[string]bool{}
	for _, base := range slices.Clone(probes) {
		scope := accessScope(base.route)
		op := base.method + " " + base.route
		if scope == "" || base.status >= 300 || done[op] {
			continue
		}
		done[op] = true
		refusal := func(name string, status int, key string, setup func(*oasFakes)) oasProbe {
			p := base
			p.name, p.status, p.key, p.setup, p.header = op+" "+name, status, key, setup, nil
			return p
		}
		probes = append(probes,
			refusal("no key", 401, oasNoKey, nil),
			refusal("not bearer", 401, oasNoKey, nil),
			refusal("malformed key", 401, "not-a-key", nil),
			refusal("unknown key", 401, oasKeyUnknown.full, nil),
			refusal("revoked key", 401, oasKeyRevoked.full, nil),
			refusal("wrong scope", 403, oasKeyWithout[scope].full, nil),
			refusal("X-API-Key", base.status, oasNoKey, nil),
			refusal("key rate limited", 429, "", func(f *oasFakes) { f.perKey = auth.Limit{Rate: 0.01, Burst: 1} }),
			refusal("client rate limited", 429, oasNoKey, func(f *oasFakes) { f.perClient = auth.Limit{Rate: 0.01, Burst: 1} }),
			refusal("key store down", 503, "", func(f *oasFakes) { f.keysDown = true }),
		)
		n := len(probes)
		if oasPublicRoute(base.route) {
			// No credential at all is the public view; every other refusal stands.
			probes[n-10].status = base.status
		}
		probes[n-9].header = map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}
		probes[n-4].header = map[string]string{"X-API-Key": oasKeyAll.full}
		probes[n-3].before, probes[n-2].before = 1, 1
		if base.route == "/verify" || base.route == "/settle" {
			// A payment's payee is checked against the key's allow-list; a delivery record is
			// checked against the settlement's own key instead.
			probes = append(probes,
				refusal("payTo not allowed", 403, oasKeyOtherTo.full, nil),
				refusal("payTo allowed", base.status, oasKeyPayTo.full, nil))
		}
	}
	return probes
}

// oasPublicRoute reports whether an OpenAPI path is a route answering the public view without a key.
func oasPublicRoute(path string) bool {
	return publicRoute(regexp.MustCompile(`\{([^}]+)\}`).ReplaceAllString(path, ":$1"))
}

// TestOpenAPIRoutes: every route New registers, with every optional group on, is in the
// document with its method, and every operation of the document is a route.
func TestOpenAPIRoutes(t *testing.T) {
	doc := oasLoad(t)
	s := oasServer(t, oasDefaultFakes())
	routes := map[string]bool{}
	for _, r := range s.echo.Routes() {
		if !slices.Contains(oasMethods, strings.ToLower(r.Method)) {
			continue // echo's own entries (route-not-found handlers), none of ours
		}
		if r.Path == "/console" || strings.HasPrefix(r.Path, "/console/") {
			continue // the console's pages are HTML for people (docs/console.md), not the API
		}
		if strings.Contains(r.Path, "*") {
			t.Errorf("route %s %s: wildcards have no OpenAPI form; describe it by hand and teach this test", r.Method, r.Path)
		}
		routes[r.Method+" "+oasPath(r.Path)] = true
	}
	for _, r := range []string{"POST /settle", "GET /v1/payments/{id}", "POST /v1/webhooks"} {
		if !routes[r] {
			t.Fatalf("%s is not registered: are all optional route groups on? %v", r, routes)
		}
	}
	ops := oasOps(doc)
	for r := range routes {
		if ops[r] == nil {
			t.Errorf("route %s is not in api/openapi.json", r)
		}
	}
	for op := range ops {
		if !routes[op] {
			t.Errorf("api/openapi.json describes %s, which is not a route", op)
		}
	}

	// Each operation is named, and declares exactly its path's parameters.
	ids := map[string]string{}
	paramName := regexp.MustCompile(`\{([^}]+)\}`)
	for key, op := range ops {
		id, _ := op["operationId"].(string)
		if id == "" || op["summary"] == nil {
			t.Errorf("%s: operationId and summary are required", key)
		}
		if other, dup := ids[id]; dup {
			t.Errorf("operationId %q is used by %s and %s", id, other, key)
		}
		ids[id] = key
		path := strings.SplitN(key, " ", 2)[1]
		var want, got []string
		for _, m := range paramName.FindAllStringSubmatch(path, -1) {
			want = append(want, m[1])
		}
		params, _ := oasGet(doc, "paths", path, "parameters").([]any)
		opParams, _ := op["parameters"].([]any)
		for _, p := range append(params, opParams...) {
			pm := oasDeref(t, doc, p)
			if pm["in"] == "path" {
				if pm["required"] != true {
					t.Errorf("%s: path parameter %v must be required", key, pm["name"])
				}
				got = append(got, pm["name"].(string))
			}
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Errorf("%s: path parameters %v, declared %v", key, want, got)
		}
	}
}

// TestOpenAPISecurity: each operation's security is the key scope the guard asks for its route
// (as the role of both schemes), and none for the routes anyone may call; the schemes are the
// headers presentedKey reads.
func TestOpenAPISecurity(t *testing.T) {
	doc := oasLoad(t)
	schemes, _ := oasGet(doc, "components", "securitySchemes").(map[string]any)
	want := map[string]map[string]any{
		"bearerAuth": {"type": "http", "scheme": "bearer"},
		"apiKey":     {"type": "apiKey", "in": "header", "name": "X-API-Key"},
	}
	if len(schemes) != len(want) {
		t.Errorf("components.securitySchemes has %v, want %v", slices.Sorted(maps.Keys(schemes)), slices.Sorted(maps.Keys(want)))
	}
	for name, fields := range want {
		for k, v := range fields {
			if got := oasGet(schemes, name, k); got != v {
				t.Errorf("securitySchemes.%s.%s is %v, want %v", name, k, got, v)
			}
		}
	}
	for key, op := range oasOps(doc) {
		sec, ok := op["security"]
		if !ok {
			sec, ok = doc["security"]
		}
		if !ok {
			t.Errorf("%s: no security requirement (use [] for a route anyone may call)", key)
			continue
		}
		list, _ := sec.([]any)
		path := strings.SplitN(key, " ", 2)[1]
		scope := accessScope(path)
		if oasPublicRoute(path) {
			// The public view: no key at all is one of the ways in ({}), first.
			if len(list) == 0 || len(list[0].(map[string]any)) != 0 {
				t.Errorf("%s answers the public view without a key: its security must start with {}, got %v", key, sec)
			} else {
				list = list[1:]
			}
		} else if slices.ContainsFunc(list, func(r any) bool { m, _ := r.(map[string]any); return len(m) == 0 }) {
			t.Errorf("%s names {} (no key) in its security, and its route has no public view", key)
		}
		if scope == "" {
			if len(list) != 0 {
				t.Errorf("%s needs no key, the document requires %v", key, sec)
			}
			continue
		}
		got := map[string][]string{}
		for _, req := range list {
			m, _ := req.(map[string]any)
			if len(m) != 1 {
				t.Errorf("%s: security requirement %v must name one scheme (either header is enough)", key, req)
			}
			for name, roles := range m {
				got[name] = oasStrings(roles)
			}
		}
		for name := range want {
			if !slices.Equal(got[name], []string{string(scope)}) {
				t.Errorf("%s: security %s roles are %v, the route needs scope %s", key, name, got[name], scope)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: security names %v, want %v", key, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
	}
}

// TestOpenAPISchemas: each schema mirroring a Go type has exactly its JSON fields, compatible
// types, and (for answers) required = the fields without omitempty.
func TestOpenAPISchemas(t *testing.T) {
	doc := oasLoad(t)
	for _, m := range oasMirrors {
		t.Run(m.schema, func(t *testing.T) {
			node := oasGet(doc, "components", "schemas", m.schema)
			if node == nil {
				t.Fatalf("components.schemas.%s is missing", m.schema)
			}
			schema := oasDeref(t, doc, node)
			props, _ := schema["properties"].(map[string]any)
			fields := oasJSONFields(m.typ)
			var want, got []string
			for name := range fields {
				want = append(want, name)
			}
			for name := range props {
				got = append(got, name)
			}
			sort.Strings(want)
			sort.Strings(got)
			if !slices.Equal(want, got) {
				t.Errorf("%s has properties %v, %s has JSON fields %v", m.schema, got, m.typ, want)
			}
			var required []string
			for _, r := range oasStrings(schema["required"]) {
				if props[r] == nil {
					t.Errorf("%s requires %q, which is not one of its properties", m.schema, r)
				}
				required = append(required, r)
			}
			if m.response {
				var mandatory []string
				for name, f := range fields {
					if !f.omitempty {
						mandatory = append(mandatory, name)
					}
				}
				sort.Strings(mandatory)
				sort.Strings(required)
				if !slices.Equal(mandatory, required) {
					t.Errorf("%s requires %v; the fields of %s without omitempty are %v", m.schema, required, m.typ, mandatory)
				}
			}
			for name, f := range fields {
				if props[name] == nil {
					continue
				}
				types := oasTypes(t, doc, props[name])
				if types == nil {
					continue // no type constraint (json.RawMessage, oneOf, …)
				}
				allowed := oasGoJSONTypes(f.typ)
				if allowed == nil {
					continue // any JSON
				}
				for _, ty := range types {
					if ty != "null" && !slices.Contains(allowed, ty) {
						t.Errorf("%s.%s is %v in the document, but %s (%s) encodes as %v", m.schema, name, types, f.goName, f.typ, allowed)
					}
				}
			}
		})
	}

	// The event types are "status" and settlement.<state> for every state notify sends.
	want := []string{"status"}
	for _, s := range notify.EventStates() {
		want = append(want, "settlement."+s)
	}
	got := oasStrings(oasGet(doc, "components", "schemas", "WebhookEvent", "properties", "type", "enum"))
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(want, got) {
		t.Errorf("WebhookEvent.type enum is %v, notify sends %v", got, want)
	}
	// The webhook POST's headers are notify's.
	var headers []string
	for _, p := range oasGet(doc, "webhooks", "settlementEvent", "post", "parameters").([]any) {
		headers = append(headers, oasDeref(t, doc, p)["name"].(string))
	}
	wantHeaders := []string{notify.HeaderEventID, notify.HeaderSignature, notify.HeaderTimestamp}
	sort.Strings(headers)
	sort.Strings(wantHeaders)
	if !slices.Equal(headers, wantHeaders) {
		t.Errorf("the settlementEvent webhook documents headers %v, notify sends %v", headers, wantHeaders)
	}
}

// TestOpenAPIParameters: the path-parameter patterns are the handlers' own checks.
func TestOpenAPIParameters(t *testing.T) {
	doc := oasLoad(t)
	pattern := func(param string) *regexp.Regexp {
		p := oasDeref(t, doc, oasGet(doc, "components", "parameters", param))
		s, _ := oasDeref(t, doc, p["schema"])["pattern"].(string)
		re, err := regexp.Compile(s)
		if err != nil || s == "" {
			t.Fatalf("parameter %s: pattern %q: %v", param, s, err)
		}
		return re
	}
	for param, re := range map[string]string{"Asset": status.AddressPattern, "From": status.AddressPattern, "Nonce": status.HashPattern, "TxHash": status.HashPattern, "PaymentId": status.PaymentIDPattern} {
		if got := pattern(param).String(); got != re {
			t.Errorf("parameter %s: pattern %q, the handler checks %q", param, got, re)
		}
	}
	network := pattern("Network")
	for _, s := range []string{"eip155:1", "eip155:8453", "eip155:", "eip155:x", "eip155:-1", "eip155:1 ", "eip15:1", "solana:5eykt4", "EIP155:1", ""} {
		_, err := facilitator.ParseCAIP2(s)
		if network.MatchString(s) != (err == nil) {
			t.Errorf("network %q: the document's pattern says %v, ParseCAIP2 says %v", s, network.MatchString(s), err)
		}
	}
	nonce := pattern("Nonce")
	for _, s := range []string{oasNonce, strings.ToUpper(oasNonce[2:]), "0X" + oasNonce[2:], oasNonce + "00", oasNonce[:65], "0x" + strings.Repeat("g", 64)} {
		_, ok := status.ParseNonce(s)
		if nonce.MatchString(s) != ok {
			t.Errorf("nonce %q: the document's pattern says %v, ParseNonce says %v", s, nonce.MatchString(s), ok)
		}
	}
}

// TestOpenAPIResponses probes a server on fakes: every answer's status is documented for its
// operation, its body validates against the documented schema (no undocumented field anywhere),
// its headers are documented; and every documented status and header is answered by some probe.
func TestOpenAPIResponses(t *testing.T) {
	doc := oasLoad(t)
	// The headers any response documents: each one a probe answers must be documented there.
	watched := map[string]bool{}
	for _, op := range oasOps(doc) {
		for _, r := range op["responses"].(map[string]any) {
			for h := range oasDerefMap(doc, r, "headers") {
				watched[http.CanonicalHeaderKey(h)] = true
			}
		}
	}
	covered := map[string]bool{} // "METHOD /path status" and "METHOD /path status header"
	for _, p := range oasProbes(t) {
		t.Run(p.name, func(t *testing.T) {
			f := oasDefaultFakes()
			if p.setup != nil {
				p.setup(f)
			}
			s := oasServer(t, f)
			req := httptest.NewRequest(p.method, p.url, strings.NewReader(p.body))
			if p.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			switch p.key {
			case oasNoKey:
			case "":
				req.Header.Set("Authorization", "Bearer "+oasKeyAll.full)
			default:
				req.Header.Set("Authorization", "Bearer "+p.key)
			}
			for k, v := range p.header {
				req.Header.Set(k, v)
			}
			for range p.before {
				r := req.Clone(req.Context())
				r.Body = io.NopCloser(strings.NewReader(p.body))
				s.Handler().ServeHTTP(httptest.NewRecorder(), r)
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			res := rec.Result()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != p.status {
				t.Fatalf("%s %s: status %d, want %d: %s", p.method, p.url, res.StatusCode, p.status, body)
			}
			op, _ := oasGet(doc, "paths", p.route, strings.ToLower(p.method)).(map[string]any)
			if op == nil {
				t.Fatalf("%s %s is not in the document", p.method, p.route)
			}
			key := fmt.Sprintf("%s %s %d", p.method, p.route, p.status)
			rn := oasGet(op, "responses", strconv.Itoa(p.status))
			if rn == nil {
				t.Fatalf("%s answered %d, which the document does not list: %s", key, p.status, body)
			}
			covered[key] = true
			resp := oasDeref(t, doc, rn)
			documented := oasDerefMap(doc, resp, "headers")
			for h := range res.Header {
				h = http.CanonicalHeaderKey(h)
				if !watched[h] {
					continue
				}
				if _, ok := oasHeader(documented, h); !ok {
					t.Errorf("%s sets %s, which the document does not list for it", key, h)
					continue
				}
				covered[key+" "+h] = true
				hs, _ := oasHeader(documented, h)
				if errs := oasValidate(doc, oasGet(oasDeref(t, doc, hs), "schema"), oasHeaderValue(res.Header.Get(h)), h, false); len(errs) > 0 {
					t.Errorf("%s header: %v", key, errs)
				}
			}
			if p.body != "" && p.status < 300 {
				// A request the server accepted must be one the document accepts.
				schema := oasGet(op, "requestBody", "content", "application/json", "schema")
				var v any
				if err := json.Unmarshal([]byte(p.body), &v); err != nil {
					t.Fatal(err)
				}
				for _, e := range oasValidate(doc, schema, v, "request", false) {
					t.Errorf("%s: the request the server accepted does not match the document: %s", key, e)
				}
			}
			content, _ := resp["content"].(map[string]any)
			if content == nil {
				if len(body) != 0 {
					t.Errorf("%s: the document says no body, got %s", key, body)
				}
				return
			}
			mediaType := strings.TrimSpace(strings.SplitN(res.Header.Get("Content-Type"), ";", 2)[0])
			media, _ := content[mediaType].(map[string]any)
			if media == nil {
				t.Fatalf("%s: Content-Type %q is not documented (%v)", key, mediaType, slices.Sorted(maps.Keys(content)))
			}
			switch mediaType {
			case "application/json":
				var v any
				if err := json.Unmarshal(body, &v); err != nil {
					t.Fatalf("%s: body is not JSON: %v: %s", key, err, body)
				}
				for _, e := range oasValidate(doc, media["schema"], v, "body", true) {
					t.Errorf("%s: %s (body %s)", key, e, body)
				}
			case "text/event-stream":
				oasCheckStream(t, doc, key, body)
			case "text/csv":
				if !bytes.HasPrefix(body, []byte("network,asset,payer,payee,amount,")) || bytes.Count(body, []byte("\n")) < 2 {
					t.Errorf("%s: not the CSV export's header and rows: %s", key, body)
				}
			case "text/plain":
				if len(body) == 0 {
					t.Errorf("%s: empty text body", key)
				}
			case "text/html":
				if !bytes.HasPrefix(body, []byte("<!doctype html>")) {
					t.Errorf("%s: not a page: %s", key, body)
				}
			default:
				t.Errorf("%s: no check for %s", key, mediaType)
			}
		})
	}
	if t.Failed() {
		return
	}
	for opKey, op := range oasOps(doc) {
		for status, r := range op["responses"].(map[string]any) {
			key := opKey + " " + status
			if !covered[key] {
				t.Errorf("the document lists %s, and no probe gets it: add a probe, or drop it if no handler answers it", key)
				continue
			}
			for h := range oasDerefMap(doc, r, "headers") {
				if !covered[key+" "+http.CanonicalHeaderKey(h)] {
					t.Errorf("the document lists header %s for %s, and no probe gets it", h, key)
				}
			}
		}
	}
}

// oasCheckStream checks an event stream: each message's event is a documented type and its
// data a WebhookEvent.
func oasCheckStream(t *testing.T, doc map[string]any, key string, body []byte) {
	t.Helper()
	if !bytes.HasPrefix(body, []byte("retry: 1000\n\n")) {
		t.Errorf("%s: the stream does not start with retry: %q", key, body)
	}
	types := oasStrings(oasGet(doc, "components", "schemas", "WebhookEvent", "properties", "type", "enum"))
	schema := map[string]any{"$ref": "#/components/schemas/WebhookEvent"}
	events := 0
	var event string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
			if !slices.Contains(types, event) {
				t.Errorf("%s: event %q is not a documented type", key, event)
			}
		case strings.HasPrefix(line, "data: "):
			events++
			var v any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &v); err != nil {
				t.Fatalf("%s: data is not JSON: %v", key, err)
			}
			if ty, _ := oasGet(v, "type").(string); ty != event {
				t.Errorf("%s: event %q carries type %q", key, event, ty)
			}
			for _, e := range oasValidate(doc, schema, v, "data", true) {
				t.Errorf("%s: %s", key, e)
			}
		}
	}
	if events == 0 {
		t.Errorf("%s: the stream carried no event: %q", key, body)
	}
}

// TestOpenAPIExamples: the document's examples, and the repository's example request, are what
// the document's schemas describe.
func TestOpenAPIExamples(t *testing.T) {
	doc := oasLoad(t)
	for opKey, op := range oasOps(doc) {
		for status, r := range op["responses"].(map[string]any) {
			for mt, media := range oasDerefMap(doc, r, "content") {
				for name, ex := range oasDerefMap(doc, media, "examples") {
					v := oasGet(ex, "value")
					for _, e := range oasValidate(doc, oasGet(media, "schema"), v, "example", true) {
						t.Errorf("%s %s %s example %s: %s", opKey, status, mt, name, e)
					}
				}
			}
		}
	}
	raw, err := os.ReadFile("../examples/verify-v2.json")
	if err != nil {
		t.Fatal(err)
	}
	var v2 map[string]any
	if err := json.Unmarshal(raw, &v2); err != nil {
		t.Fatal(err)
	}
	schema := map[string]any{"$ref": "#/components/schemas/VerifyRequest"}
	if errs := oasValidate(doc, schema, v2, "verify-v2.json", false); len(errs) > 0 {
		t.Errorf("examples/verify-v2.json: %v", errs)
	}
	// The same payment as v1.
	pp := v2["paymentPayload"].(map[string]any)
	req := v2["paymentRequirements"].(map[string]any)
	v1 := map[string]any{
		"x402Version":    1,
		"paymentPayload": map[string]any{"x402Version": 1, "scheme": "exact", "network": "base-sepolia", "payload": pp["payload"]},
		"paymentRequirements": map[string]any{"scheme": "exact", "network": "base-sepolia", "maxAmountRequired": req["amount"],
			"resource": "http://localhost:3000/weather", "description": "", "mimeType": "", "payTo": req["payTo"],
			"maxTimeoutSeconds": 60, "asset": req["asset"], "extra": req["extra"]},
	}
	b, _ := json.Marshal(v1)
	var v1any any
	_ = json.Unmarshal(b, &v1any)
	if _, err := facilitator.DecodeRequest(b); err != nil {
		t.Fatalf("the v1 example does not decode: %v", err)
	}
	if errs := oasValidate(doc, schema, v1any, "v1 request", false); len(errs) > 0 {
		t.Errorf("v1 request: %v", errs)
	}
	// A request the decoder refuses for a missing field must not match the document either.
	delete(v2["paymentRequirements"].(map[string]any), "payTo")
	if errs := oasValidate(doc, schema, v2, "verify-v2.json without payTo", false); len(errs) == 0 {
		t.Error("a request without paymentRequirements.payTo matches the document")
	}
}

// TestOpenAPIReasons: every reason code the code uses is explained somewhere in the document.
func TestOpenAPIReasons(t *testing.T) {
	text := string(openAPIDocument)
	root := ".."
	consts := map[string]string{} // name → value, of exported Reason* string constants
	for _, dir := range []string{"facilitator", "notify", "api"} {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
							continue
						}
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							v, _ := strconv.Unquote(lit.Value)
							consts[dir+"."+name.Name] = v
						}
					}
				}
			}
		}
	}
	if len(consts) < 30 {
		t.Fatalf("found only %d reason constants: %v", len(consts), consts)
	}
	// A constant counts when some non-test file other than its declaration names it.
	used := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for qual := range consts {
			pkg, name, _ := strings.Cut(qual, ".")
			same := filepath.Base(filepath.Dir(path)) == pkg
			if (same && bytes.Contains(b, []byte(name)) && !oasDeclares(b, name)) || bytes.Contains(b, []byte(pkg+"."+name)) {
				used[qual] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for qual, v := range consts {
		if !used[qual] {
			continue
		}
		if !regexp.MustCompile(`(^|[^a-z0-9_])` + regexp.QuoteMeta(v) + `($|[^a-z0-9_])`).MatchString(text) {
			t.Errorf("reason %s (%q) is used but not described in api/openapi.json", qual, v)
		}
	}
}

// oasDeclares reports whether src declares the constant name (then only its other uses count).
func oasDeclares(src []byte, name string) bool {
	decl := regexp.MustCompile(`(?m)^\s*(const\s+)?` + name + `\s*=`)
	locs := decl.FindAllIndex(src, -1)
	return len(locs) > 0 && bytes.Count(src, []byte(name)) == len(locs)
}

// TestOpenAPIServed: GET /openapi.json serves the embedded document over HTTP, as JSON, and it
// declares OpenAPI 3.1.
func TestOpenAPIServed(t *testing.T) {
	doc := oasLoad(t)
	if v, _ := doc["openapi"].(string); !regexp.MustCompile(`^3\.1\.\d+$`).MatchString(v) {
		t.Errorf("openapi is %q, want 3.1.x", v)
	}
	for _, f := range []*oasFakes{oasDefaultFakes(), nil} {
		var s *Server
		if f == nil {
			s = New(Config{Verifier: oasDefaultFakes()}) // no optional group: still served
		} else {
			s = oasServer(t, f)
		}
		srv := httptest.NewServer(s.Handler())
		res, err := http.Get(srv.URL + "/openapi.json")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		srv.Close()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("GET /openapi.json: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
		if !bytes.Equal(body, openAPIDocument) || !json.Valid(body) {
			t.Fatal("GET /openapi.json does not serve the embedded document")
		}
	}
	if b := OpenAPI(); !bytes.Equal(b, openAPIDocument) {
		t.Error("OpenAPI() is not the document")
	}
}

type oasField struct {
	goName    string
	typ       reflect.Type
	omitempty bool
}

// oasJSONFields lists the JSON names of t's fields as encoding/json writes them.
func oasJSONFields(t reflect.Type) map[string]oasField {
	out := map[string]oasField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				maps.Copy(out, oasJSONFields(ft))
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = oasField{goName: f.Name, typ: f.Type, omitempty: slices.Contains(strings.Split(opts, ","), "omitempty") || slices.Contains(strings.Split(opts, ","), "omitzero")}
	}
	return out
}

var (
	oasRawMessageType = reflect.TypeFor[json.RawMessage]()
	oasTimeType       = reflect.TypeFor[time.Time]()
)

// oasGoJSONTypes is the JSON types a Go type encodes as; nil for any.
func oasGoJSONTypes(t reflect.Type) []string {
	if t == oasRawMessageType || t.Kind() == reflect.Interface {
		return nil
	}
	if t == oasTimeType {
		return []string{"string"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return oasGoJSONTypes(t.Elem())
	case reflect.Bool:
		return []string{"boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return []string{"integer"}
	case reflect.Float32, reflect.Float64:
		return []string{"number", "integer"}
	case reflect.String:
		return []string{"string"}
	case reflect.Slice, reflect.Array:
		return []string{"array"}
	case reflect.Map, reflect.Struct:
		return []string{"object"}
	}
	return nil
}

// oasTypes is the "type" of a schema (following $ref), nil when it has none.
func oasTypes(t *testing.T, doc map[string]any, node any) []string {
	t.Helper()
	m, ok := node.(map[string]any)
	if !ok {
		return nil
	}
	if ty, ok := m["type"]; ok {
		if s, ok := ty.(string); ok {
			return []string{s}
		}
		return oasStrings(ty)
	}
	if _, ok := m["$ref"]; ok {
		return oasTypes(t, doc, oasDeref(t, doc, m))
	}
	return nil
}

func oasStrings(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// oasDerefMap is node[key] as a map, following $refs on node and on the result's values.
func oasDerefMap(doc map[string]any, node any, key string) map[string]any {
	for range 10 {
		m, ok := node.(map[string]any)
		if !ok {
			return nil
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			break
		}
		node = oasGet(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
	}
	out, _ := oasGet(node, key).(map[string]any)
	return out
}

func oasHeader(headers map[string]any, name string) (any, bool) {
	for k, v := range headers {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return nil, false
}

// oasHeaderValue reads a header value as its schema sees it: a number when it is one.
func oasHeaderValue(s string) any {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return float64(n)
	}
	return s
}

// oasValidate checks v against a JSON Schema subset (the keywords the document uses): $ref,
// type, const, enum, pattern, properties, required, additionalProperties, items, oneOf, anyOf,
// minimum, maxItems, maxLength. strict refuses object keys the schema does not declare unless it
// allows additional properties: an answer with an undocumented field fails.
func oasValidate(doc map[string]any, schema any, v any, at string, strict bool) []string {
	m, ok := schema.(map[string]any)
	if !ok {
		if schema == nil {
			return []string{at + ": no schema"}
		}
		return nil
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, args...)) }
	if ref, ok := m["$ref"].(string); ok {
		target := oasGet(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
		if target == nil {
			return []string{at + ": $ref " + ref + " names nothing"}
		}
		errs = append(errs, oasValidate(doc, target, v, at, strict)...)
	}
	if ty, ok := m["type"]; ok {
		types := oasStrings(ty)
		if s, ok := ty.(string); ok {
			types = []string{s}
		}
		if !slices.ContainsFunc(types, func(ty string) bool { return oasIsType(v, ty) }) {
			bad("%s is not of type %v", oasShort(v), types)
			return errs
		}
	}
	if c, ok := m["const"]; ok && !reflect.DeepEqual(c, v) {
		bad("%s is not %v", oasShort(v), c)
	}
	if e, ok := m["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return reflect.DeepEqual(x, v) }) {
		bad("%s is not one of %v", oasShort(v), e)
	}
	if s, ok := v.(string); ok {
		if p, ok := m["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(s) {
			bad("%q does not match %s", s, p)
		}
		if n, ok := m["maxLength"].(float64); ok && float64(len([]rune(s))) > n {
			bad("longer than %v", n)
		}
	}
	if n, ok := v.(float64); ok {
		if min, ok := m["minimum"].(float64); ok && n < min {
			bad("%v is below %v", n, min)
		}
	}
	if obj, ok := v.(map[string]any); ok {
		props, _ := m["properties"].(map[string]any)
		for _, r := range oasStrings(m["required"]) {
			if _, ok := obj[r]; !ok {
				bad("%s is required", r)
			}
		}
		for k, x := range obj {
			if ps, ok := props[k]; ok {
				errs = append(errs, oasValidate(doc, ps, x, at+"."+k, strict)...)
				continue
			}
			switch ap := m["additionalProperties"].(type) {
			case map[string]any:
				errs = append(errs, oasValidate(doc, ap, x, at+"."+k, strict)...)
			case bool:
				if !ap {
					bad("%s is not allowed", k)
				}
			default:
				_, composite := m["$ref"]
				if strict && !composite && m["oneOf"] == nil && m["anyOf"] == nil && oasIsType(v, "object") && m["type"] != nil {
					bad("%s is not in the document", k)
				}
			}
		}
	}
	if arr, ok := v.([]any); ok {
		if n, ok := m["maxItems"].(float64); ok && float64(len(arr)) > n {
			bad("more than %v items", n)
		}
		for i, x := range arr {
			errs = append(errs, oasValidate(doc, m["items"], x, fmt.Sprintf("%s[%d]", at, i), strict)...)
		}
	}
	if one, ok := m["oneOf"].([]any); ok {
		n := 0
		var all []string
		for _, s := range one {
			e := oasValidate(doc, s, v, at, strict)
			if len(e) == 0 {
				n++
			}
			all = append(all, e...)
		}
		if n != 1 {
			bad("matches %d of oneOf, want 1: %v", n, all)
		}
	}
	if anyOf, ok := m["anyOf"].([]any); ok {
		var all []string
		matched := false
		for _, s := range anyOf {
			e := oasValidate(doc, s, v, at, strict)
			if len(e) == 0 {
				matched = true
				break
			}
			all = append(all, e...)
		}
		if !matched {
			bad("matches none of anyOf: %v", all)
		}
	}
	return errs
}

func oasIsType(v any, ty string) bool {
	switch ty {
	case "null":
		return v == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		n, ok := v.(float64)
		return ok && n == math.Trunc(n)
	case "array":
		_, ok := v.([]any)
		return ok
	case "object":
		_, ok := v.(map[string]any)
		return ok
	}
	return false
}

func oasShort(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

// TestOpenAPIFinalityRule: the document's pattern for a status answer's rule matches every rule
// the domain names, and nothing else.
func TestOpenAPIFinalityRule(t *testing.T) {
	doc := oasLoad(t)
	s, _ := oasGet(doc, "components", "schemas", "StatusFinality", "properties", "rule", "pattern").(string)
	re, err := regexp.Compile(s)
	if err != nil {
		t.Fatalf("StatusFinality.rule pattern %q: %v", s, err)
	}
	for _, f := range []facilitator.Finality{{Tag: facilitator.TagFinalized, Depth: 12}, {Tag: facilitator.TagSafe}, {Depth: 12}, {}} {
		for _, rule := range []string{f.String(), f.DepthRule()} {
			if !re.MatchString(rule) {
				t.Errorf("rule %q (of %+v) does not match the document's pattern %q", rule, f, s)
			}
		}
	}
	for _, bad := range []string{"tag:latest", "depth:", "finalized", ""} {
		if re.MatchString(bad) {
			t.Errorf("the document's pattern accepts %q", bad)
		}
	}
}
