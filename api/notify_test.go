package api_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// notifyLedger is the webhook and event-stream tests' own database ("apinotify"): webhooks hear
// every settlement of their database, and the other tests' settlements are none of theirs.
func notifyLedger(t *testing.T) string { return env.Ledger(t, "apinotify") }

// notifyStack is the HTTP API with /settle (an engine on a fresh signer), the status routes and
// the notify routes, over the shared chain and the apinotify database.
type notifyStack struct {
	URL  string
	Logs *stacktest.SyncBuffer
}

type notifyOptions struct {
	deadline time.Duration
	notify   func(*notify.Config)
}

func newNotifyStack(t *testing.T, o notifyOptions) *notifyStack {
	t.Helper()
	st := newSettleStack(t, settleOptions{deadline: o.deadline, database: "apinotify", server: func(cfg *api.Config, s *settleStack) {
		stat := status.New(s.DB, []status.Network{{Network: s.Network, Head: s.Client}}, nil)
		ncfg := notify.Config{Store: s.DB, Status: stat, StreamPoll: 50 * time.Millisecond, Logger: s.Logger}
		if o.notify != nil {
			o.notify(&ncfg)
		}
		d := notify.New(ncfg)
		t.Cleanup(d.Stop)
		cfg.Status, cfg.Notify, cfg.Limits = stat, d, nil
	}})
	return &notifyStack{URL: st.URL, Logs: st.Logs}
}

// errorBody checks a {"error": reason, "message": …} answer.
func errorBody(t *testing.T, r response, status int, reason string) {
	t.Helper()
	var body map[string]string
	if r.Status != status || json.Unmarshal(r.Body, &body) != nil || body["error"] != reason || body["message"] == "" {
		t.Fatalf("want %d {error: %s, message}, got %s", status, reason, r)
	}
}

type webhookAnswer struct {
	ID        string    `json:"id"`
	Secret    string    `json:"secret"`
	URL       string    `json:"url"`
	PayTo     []string  `json:"payTo"`
	CreatedAt time.Time `json:"createdAt"`
}

var (
	webhookIDRE = regexp.MustCompile(`^wh_[0-9a-f]{32}$`)
	secretRE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// TestWebhookRegistration: register, list (never a secret), delete; bad input is a 400 saying
// what is wrong, an unknown id a 404.
func TestWebhookRegistration(t *testing.T) {
	s := newNotifyStack(t, notifyOptions{notify: func(c *notify.Config) { c.MaxWebhooks = 3 }})
	t.Cleanup(func() { deleteWebhooks(t, s.URL) }) // the limit counts them: leave none behind
	payTo := chain.Accounts[2].Address
	lower := strings.ToLower(payTo.Hex())

	r := do(t, http.MethodPost, s.URL+"/v1/webhooks", []byte(`{"url": "https://merchant.example/hooks?k=1", "payTo": ["`+lower+`", "`+payTo.Hex()+`"], "extra": 1}`))
	var created webhookAnswer
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &created) != nil {
		t.Fatalf("register: want 201, got %s", r)
	}
	if !webhookIDRE.MatchString(created.ID) || !secretRE.MatchString(created.Secret) || created.URL != "https://merchant.example/hooks?k=1" ||
		len(created.PayTo) != 1 || created.PayTo[0] != payTo.Hex() || time.Since(created.CreatedAt) > time.Minute {
		t.Fatalf("register answered %s", r.Body)
	}
	if r.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("the answer carrying the secret may be cached: Cache-Control %q", r.Header.Get("Cache-Control"))
	}
	r = do(t, http.MethodPost, s.URL+"/v1/webhooks", []byte(`{"url": "http://merchant.example/all"}`))
	var all webhookAnswer
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &all) != nil || all.PayTo == nil || len(all.PayTo) != 0 || all.Secret == created.Secret {
		t.Fatalf("register without payTo: want 201 with payTo [] and a secret of its own, got %s", r)
	}

	list := func() map[string]map[string]any {
		t.Helper()
		r := do(t, http.MethodGet, s.URL+"/v1/webhooks", nil)
		var body struct {
			Webhooks []map[string]any `json:"webhooks"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &body) != nil || body.Webhooks == nil {
			t.Fatalf("list: want 200 {webhooks: [...]}, got %s", r)
		}
		out := map[string]map[string]any{}
		for _, w := range body.Webhooks {
			if _, ok := w["secret"]; ok {
				t.Fatalf("a listed webhook carries its secret: %s", r.Body)
			}
			out[w["id"].(string)] = w
		}
		return out
	}
	ws := list()
	if ws[created.ID] == nil || ws[all.ID] == nil || ws[created.ID]["url"] != created.URL {
		t.Fatalf("list lacks the registered webhooks: %v", ws)
	}

	for name, tc := range map[string]struct {
		body   string
		reason string
		words  string
	}{
		"not JSON":             {`url=https://x`, notify.ReasonInvalidWebhook, "body"},
		"url a number":         {`{"url": 1}`, notify.ReasonInvalidWebhook, "body"},
		"no url":               {`{"payTo": []}`, notify.ReasonInvalidWebhook, "required"},
		"relative url":         {`{"url": "/hooks"}`, notify.ReasonInvalidWebhook, "http or https"},
		"ftp":                  {`{"url": "ftp://merchant.example/x"}`, notify.ReasonInvalidWebhook, "http or https"},
		"no host":              {`{"url": "https:///x"}`, notify.ReasonInvalidWebhook, "no host"},
		"credentials":          {`{"url": "https://u:p@merchant.example/"}`, notify.ReasonInvalidWebhook, "credentials"},
		"loopback":             {`{"url": "http://127.0.0.1:8080/"}`, notify.ReasonInvalidWebhook, "public"},
		"metadata service":     {`{"url": "http://169.254.169.254/latest"}`, notify.ReasonInvalidWebhook, "public"},
		"payTo not an address": {`{"url": "https://merchant.example/", "payTo": ["0x1234"]}`, notify.ReasonInvalidWebhook, "payTo[0]"},
		"payTo without 0x":     {`{"url": "https://merchant.example/", "payTo": ["` + lower[2:] + `"]}`, notify.ReasonInvalidWebhook, "payTo[0]"},
		"payTo a string":       {`{"url": "https://merchant.example/", "payTo": "` + lower + `"}`, notify.ReasonInvalidWebhook, "body"},
		"too many payTo":       {`{"url": "https://merchant.example/", "payTo": [` + strings.Repeat(`"`+lower+`",`, 100) + `"` + lower + `"]}`, notify.ReasonInvalidWebhook, "at most"},
		"body too large":       {`{"url": "https://merchant.example/` + strings.Repeat("a", 17<<10) + `"}`, notify.ReasonInvalidWebhook, "16 KiB"},
	} {
		t.Run(name, func(t *testing.T) {
			r := do(t, http.MethodPost, s.URL+"/v1/webhooks", []byte(tc.body))
			errorBody(t, r, http.StatusBadRequest, tc.reason)
			if !strings.Contains(string(r.Body), tc.words) {
				t.Fatalf("the message does not say %q: %s", tc.words, r.Body)
			}
		})
	}
	if n := len(list()); n != 2 {
		t.Fatalf("%d webhooks listed after the bad requests, want 2", n)
	}

	// The limit: a third fits, a fourth is refused until one is deleted.
	if r := do(t, http.MethodPost, s.URL+"/v1/webhooks", []byte(`{"url": "https://merchant.example/3"}`)); r.Status != http.StatusCreated {
		t.Fatalf("third webhook: %s", r)
	}
	errorBody(t, do(t, http.MethodPost, s.URL+"/v1/webhooks", []byte(`{"url": "https://merchant.example/4"}`)), http.StatusConflict, notify.ReasonWebhookLimitReached)

	if r := do(t, http.MethodDelete, s.URL+"/v1/webhooks/"+created.ID, nil); r.Status != http.StatusNoContent || len(r.Body) != 0 {
		t.Fatalf("delete: want 204, got %s", r)
	}
	if r := do(t, http.MethodDelete, s.URL+"/v1/webhooks/"+created.ID, nil); r.Status != http.StatusNoContent {
		t.Fatalf("delete again: want 204, got %s", r)
	}
	if ws := list(); ws[created.ID] != nil || ws[all.ID] == nil {
		t.Fatalf("after delete, listed %v", ws)
	}
	if r := do(t, http.MethodPost, s.URL+"/v1/webhooks", []byte(`{"url": "https://merchant.example/4"}`)); r.Status != http.StatusCreated {
		t.Fatalf("a webhook after a delete: %s", r)
	}
	errorBody(t, do(t, http.MethodDelete, s.URL+"/v1/webhooks/wh_"+strings.Repeat("0", 32), nil), http.StatusNotFound, "not_found")
	errorBody(t, do(t, http.MethodDelete, s.URL+"/v1/webhooks/nonsense", nil), http.StatusNotFound, "not_found")
}

// sseFrame is one server-sent event as a client parses it.
type sseFrame struct {
	ID, Event, Data string
	Comment         bool
}

// sseStream is an open event stream, read in the background.
type sseStream struct {
	frames chan sseFrame
	done   chan struct{} // closed at EOF
	cancel context.CancelFunc
}

// openStream GETs an event stream and checks its head; the stream is closed at cleanup.
func openStream(t *testing.T, u, lastEventID string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" || res.Header.Get("Cache-Control") != "no-cache" {
		cancel()
		t.Fatalf("GET %s: %d %v", u, res.StatusCode, res.Header)
	}
	s := &sseStream{frames: make(chan sseFrame, 100), done: make(chan struct{}), cancel: cancel}
	t.Cleanup(cancel)
	go func() {
		defer close(s.done)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		var f sseFrame
		started := false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if started {
					s.frames <- f
				}
				f, started = sseFrame{}, false
			case strings.HasPrefix(line, ":"):
				s.frames <- sseFrame{Comment: true}
			case strings.HasPrefix(line, "id: "):
				f.ID, started = strings.TrimPrefix(line, "id: "), true
			case strings.HasPrefix(line, "event: "):
				f.Event, started = strings.TrimPrefix(line, "event: "), true
			case strings.HasPrefix(line, "data: "):
				f.Data, started = f.Data+strings.TrimPrefix(line, "data: "), true
			}
		}
	}()
	return s
}

// next returns the next event, skipping keep-alives.
func (s *sseStream) next(t *testing.T) (sseFrame, notify.Message) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case f := <-s.frames:
			if f.Comment {
				continue
			}
			var m notify.Message
			if err := json.Unmarshal([]byte(f.Data), &m); err != nil {
				t.Fatalf("frame data %q: %v", f.Data, err)
			}
			if m.ID != f.ID || (m.Type != f.Event) {
				t.Fatalf("frame id %s event %s carries message id %s type %s", f.ID, f.Event, m.ID, m.Type)
			}
			return f, m
		case <-s.done:
			t.Fatalf("the stream ended")
		case <-timeout:
			t.Fatalf("no event within 20s")
		}
	}
}

// TestEventStream: a stream opened while a settlement is pending first gives the current status,
// then each event as it happens; Last-Event-ID resumes after the event it names; keep-alives flow
// while nothing happens; the number of streams and their lifetime are bounded.
func TestEventStream(t *testing.T) {
	notifyLedger(t)       // skip before touching the chain
	p := fundedPayment(t) // minted while anvil still mines
	pid := "sse-" + hex.EncodeToString(randomBytes(t, 12))
	req := p.request(t)
	set(req, "paymentPayload.extensions", map[string]any{facilitator.PaymentIdentifierKey: map[string]any{"info": map[string]any{"id": pid}}})
	body := marshal(t, req)
	stacktest.ManualMining(t, chain)
	s := newNotifyStack(t, notifyOptions{deadline: time.Second, notify: func(c *notify.Config) {
		c.KeepAlive = 100 * time.Millisecond
		c.StreamLifetime = 5 * time.Second
		c.MaxStreams = 4
	}})

	r := do(t, http.MethodPost, s.URL+"/settle", body)
	res, _ := settlement(t, r)
	if res.Success || res.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("want settlement_pending on the stopped chain, got %s", r)
	}
	byPayment := s.URL + "/v1/events/payments/" + pid
	a := p.auth
	byAuth := s.URL + "/v1/events/authorizations/" + facilitator.CAIP2(chain.ChainID) + "/" + chain.USDC.Address.Hex() + "/" +
		a.From.Hex() + "/0x" + hex.EncodeToString(a.Nonce[:])

	opened := time.Now()
	streamA, streamB := openStream(t, byPayment, ""), openStream(t, byAuth, "")
	var snapshot string
	for name, st := range map[string]*sseStream{"by payment id": streamA, "by authorization": streamB} {
		f, m := st.next(t)
		if f.Event != "status" || m.Data.State != facilitator.StatusPending || m.Data.Transaction != res.Transaction || m.State != "broadcast" {
			t.Fatalf("%s: first event %s %s, want the pending status with %s", name, f.Event, f.Data, res.Transaction)
		}
		if name == "by payment id" && m.Data.PaymentID != pid {
			t.Fatalf("the snapshot by payment id lacks the id: %s", f.Data)
		}
		if snapshot != "" && f.ID != snapshot {
			t.Fatalf("the two snapshots resume from %s and %s", snapshot, f.ID)
		}
		snapshot = f.ID
	}
	// Idle: keep-alive comments.
	select {
	case f := <-streamA.frames:
		if !f.Comment {
			t.Fatalf("an event while nothing happened: %+v", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no keep-alive")
	}

	if err := chain.Mine(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mined, final string
	for name, st := range map[string]*sseStream{"by payment id": streamA, "by authorization": streamB} {
		f, m := st.next(t)
		if f.Event != "settlement.mined" || m.State != "mined" || m.Data.State != facilitator.StatusSettled || m.Data.Transaction != res.Transaction {
			t.Fatalf("%s: after the block, %s %s, want settlement.mined", name, f.Event, f.Data)
		}
		if n, _ := strconv.ParseInt(f.ID, 10, 64); n <= mustInt(t, snapshot) {
			t.Fatalf("%s: mined id %s not after the snapshot's %s", name, f.ID, snapshot)
		}
		mined = f.ID
		f, _ = st.next(t)
		if f.Event != "settlement.final" {
			t.Fatalf("%s: after mined, %s, want settlement.final", name, f.Event)
		}
		final = f.ID
	}

	// Resuming from the snapshot replays what came after it, and nothing before; resuming from
	// mined gives final.
	streamC := openStream(t, byPayment, snapshot)
	if f, _ := streamC.next(t); f.Event != "settlement.mined" || f.ID != mined {
		t.Fatalf("resumed after %s: first %s %s, want settlement.mined %s", snapshot, f.Event, f.ID, mined)
	}
	if f, _ := streamC.next(t); f.Event != "settlement.final" || f.ID != final {
		t.Fatalf("resumed after %s: second %s %s, want settlement.final %s", snapshot, f.Event, f.ID, final)
	}
	streamD := openStream(t, byAuth, mined)
	if f, _ := streamD.next(t); f.Event != "settlement.final" || f.ID != final {
		t.Fatalf("resumed after %s: first %s %s, want settlement.final %s", mined, f.Event, f.ID, final)
	}

	// Four streams are open: the fifth waits for one to close.
	r = do(t, http.MethodGet, byPayment, nil)
	errorBody(t, r, http.StatusServiceUnavailable, "too_many_streams")
	if r.Header.Get("Retry-After") == "" {
		t.Fatalf("503 without Retry-After")
	}
	streamD.cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, byPayment, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		cancel()
		if res.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a client left, and a new stream is still refused: %d", res.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The lifetime bound ends a stream by itself.
	select {
	case <-streamA.done:
		if time.Since(opened) < 4*time.Second {
			t.Fatalf("the stream ended after %s, before its lifetime", time.Since(opened))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream outlived its lifetime")
	}
}

// TestEventStreamErrors: unknown keys are 404 JSON, malformed ones and a bad Last-Event-ID 400.
func TestEventStreamErrors(t *testing.T) {
	s := newNotifyStack(t, notifyOptions{})
	network, asset := facilitator.CAIP2(chain.ChainID), chain.USDC.Address.Hex()
	from := chain.Accounts[1].Address.Hex()
	nonce := "0x" + hex.EncodeToString(randomBytes(t, 32))
	errorBody(t, do(t, http.MethodGet, s.URL+"/v1/events/payments/never-seen-this-id-0001", nil), http.StatusNotFound, "not_found")
	errorBody(t, do(t, http.MethodGet, s.URL+"/v1/events/authorizations/"+network+"/"+asset+"/"+from+"/"+nonce, nil), http.StatusNotFound, "not_found")
	errorBody(t, do(t, http.MethodGet, s.URL+"/v1/events/payments/short", nil), http.StatusBadRequest, facilitator.ReasonInvalidPaymentIdentifier)
	errorBody(t, do(t, http.MethodGet, s.URL+"/v1/events/authorizations/"+network+"/"+asset+"/"+from+"/0x12", nil), http.StatusBadRequest, "invalid_parameter")
	errorBody(t, do(t, http.MethodGet, s.URL+"/v1/events/authorizations/"+network+"/nope/"+from+"/"+nonce, nil), http.StatusBadRequest, "invalid_parameter")
	errorBody(t, do(t, http.MethodGet, s.URL+"/v1/events/authorizations/mainnet/"+asset+"/"+from+"/"+nonce, nil), http.StatusBadRequest, facilitator.ReasonInvalidNetwork)

	req, _ := http.NewRequest(http.MethodGet, s.URL+"/v1/events/payments/never-seen-this-id-0001", nil)
	req.Header.Set("Last-Event-ID", "abc")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("Last-Event-ID abc: want 400, got %d", res.StatusCode)
	}
}

// TestNotifyRoutesNeedNotify: without a Notify the routes do not exist.
func TestNotifyRoutesNeedNotify(t *testing.T) {
	s := newStack(t, stackOptions{})
	if r := do(t, http.MethodGet, s.URL+"/v1/webhooks", nil); r.Status != http.StatusNotFound {
		t.Fatalf("GET /v1/webhooks without Notify: %s", r)
	}
}

// deleteWebhooks disables every listed webhook.
func deleteWebhooks(t *testing.T, base string) {
	t.Helper()
	var body struct {
		Webhooks []struct {
			ID string `json:"id"`
		} `json:"webhooks"`
	}
	if r := do(t, http.MethodGet, base+"/v1/webhooks", nil); json.Unmarshal(r.Body, &body) != nil {
		t.Fatalf("list: %s", r)
	}
	for _, w := range body.Webhooks {
		if r := do(t, http.MethodDelete, base+"/v1/webhooks/"+w.ID, nil); r.Status != http.StatusNoContent {
			t.Errorf("delete %s: %s", w.ID, r)
		}
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not an event id", s)
	}
	return n
}
