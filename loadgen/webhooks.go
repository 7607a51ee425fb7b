package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/notify"
)

// The webhook-dispatch phase: one webhook registered (POST /v1/webhooks) pointing at a receiver
// this process runs on loopback, K payments settled, and every confirmed payment's events
// (broadcast, mined, final) awaited at the receiver. Deliveries are counted by event id, as a
// merchant dedupes them, and only when correctly signed.

// hookStates are the event types each confirmed payment owes when nothing goes wrong (no reorg,
// no fee bump that changes the state): a merchant hears broadcast, mined and final.
var hookStates = []string{"settlement.broadcast", "settlement.mined", "settlement.final"}

// WebhookResult is the webhook-dispatch phase.
type WebhookResult struct {
	K, Confirmed int
	Expected     int // hookStates per confirmed payment
	Delivered    int // distinct event ids of the phase's payments received, signed correctly
	Missing      int // expected (payment, type) pairs never received
	Duplicates   int // deliveries of an event id already received (at-least-once retries)
	BadSignature int // deliveries whose X402-Signature did not verify (not counted otherwise)
	Others       int // distinct events of payments from earlier phases (their late finals)
	Nudges       int // evm_mine calls made while the last finals waited for a block
	// Elapsed is the first /settle to the last expected delivery (or the end of the wait).
	Elapsed time.Duration
	// Latencies are each delivered event's createdAt (the ledger's transition time) to its first
	// receipt here: the dispatch delay a merchant sees.
	Latencies   Latencies
	FirstFailed string
}

// hookDelivery is the first receipt of one event id.
type hookDelivery struct {
	typ, nonce        string
	created, received time.Time
}

// hookReceiver is the merchant's end: it checks each delivery's signature and keeps the first
// receipt of every event id.
type hookReceiver struct {
	now func() time.Time

	mu     sync.Mutex
	secret string
	got    map[string]hookDelivery
	dups   int
	badSig int
	bad    string // the first malformed delivery
}

func newHookReceiver(now func() time.Time) *hookReceiver {
	return &hookReceiver{now: now, got: map[string]hookDelivery{}}
}

func (h *hookReceiver) setSecret(s string) {
	h.mu.Lock()
	h.secret = s
	h.mu.Unlock()
}

// ServeHTTP answers 204 to a signed delivery (duplicates included: a receiver that already has
// the event acknowledges it again) and 401 to one whose signature does not verify.
func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := h.now()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	code := h.receive(at, r.Header.Get(notify.HeaderTimestamp), r.Header.Get(notify.HeaderSignature), body)
	w.WriteHeader(code)
}

// receive records one delivery and returns the status to answer.
func (h *hookReceiver) receive(at time.Time, tsHeader, sig string, body []byte) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	ts, err := strconv.ParseInt(tsHeader, 10, 64)
	if err != nil || !notify.ValidSignature(h.secret, ts, body, sig) {
		h.badSig++
		return http.StatusUnauthorized
	}
	var m notify.Message
	if err := json.Unmarshal(body, &m); err != nil || m.ID == "" {
		if h.bad == "" {
			h.bad = fmt.Sprintf("a signed delivery that is not an event: %.200s", body)
		}
		return http.StatusBadRequest
	}
	if _, ok := h.got[m.ID]; ok {
		h.dups++
		return http.StatusNoContent
	}
	h.got[m.ID] = hookDelivery{typ: m.Type, nonce: strings.ToLower(m.Data.Nonce), created: m.CreatedAt, received: at}
	return http.StatusNoContent
}

// hookTally is what the receiver holds of the phase's payments.
type hookTally struct {
	delivered, missing, others int
	lats                       Latencies
	last                       time.Time // the latest first receipt of a phase event
}

// tallyHooks counts got against the nonces of the phase's confirmed payments: every event of
// theirs is delivered (whatever its type), each (payment, hookStates type) not received is
// missing, and events of other payments are others.
func tallyHooks(got map[string]hookDelivery, nonces map[string]bool) hookTally {
	var t hookTally
	seen := map[string]bool{}
	for _, d := range got {
		if !nonces[d.nonce] {
			t.others++
			continue
		}
		t.delivered++
		seen[d.nonce+" "+d.typ] = true
		t.lats = append(t.lats, d.received.Sub(d.created))
		if d.received.After(t.last) {
			t.last = d.received
		}
	}
	for n := range nonces {
		for _, s := range hookStates {
			if !seen[n+" "+s] {
				t.missing++
			}
		}
	}
	return t
}

// hookWait bounds the wait for the last deliveries after the last payment is confirmed; a stalled
// final gets an evm_mine nudge after hookNudgeAfter without progress (a dev chain mines only on
// transactions, and a depth-1 final needs the block after the last one).
const (
	hookWait       = 2 * time.Minute
	hookNudgeAfter = 2 * time.Second
)

// runWebhookPhase registers a webhook at a loopback receiver, settles pays from c workers, waits
// for their events, and deletes the webhook. The CPU of sources is measured from the first
// /settle to the last delivery, for every event delivered meanwhile.
func runWebhookPhase(ctx context.Context, p *poster, n *node, pays []*payment, c int, sources []cpuSource) (*WebhookResult, *CPUPhase, error) {
	recv := newHookReceiver(time.Now)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: recv, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	id, secret, err := p.registerWebhook(ctx, "http://"+ln.Addr().String()+"/hook")
	if err != nil {
		return nil, nil, err
	}
	recv.setSecret(secret)
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.deleteWebhook(dctx, id)
	}()

	begin := time.Now()
	cpu := startCPU(ctx, sources, cpuEvery)
	s := runSettle(ctx, p, n, pays, c)
	confirmed := map[string]bool{}
	for i, pay := range pays {
		if s.ok[i] {
			confirmed[strings.ToLower(hexutil.Encode(pay.Auth.Nonce[:]))] = true
		}
	}
	r := &WebhookResult{K: len(pays), Confirmed: len(confirmed), Expected: len(confirmed) * len(hookStates), FirstFailed: s.FirstFailed}
	var t hookTally
	deadline := time.Now().Add(hookWait)
	lastProgress, lastMissing := time.Now(), -1
	for {
		recv.mu.Lock()
		t = tallyHooks(recv.got, confirmed)
		recv.mu.Unlock()
		if t.missing == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		if t.missing != lastMissing {
			lastProgress, lastMissing = time.Now(), t.missing
		} else if time.Since(lastProgress) > hookNudgeAfter {
			if err := n.call(ctx, nil, "evm_mine"); err != nil {
				return nil, nil, fmt.Errorf("nudging the chain for the last finals: %w", err)
			}
			r.Nudges++
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
		case <-time.After(25 * time.Millisecond):
		}
	}
	// Every delivery of the window costs CPU in it, earlier phases' late events included.
	phase := cpu.finish(ctx, t.delivered+t.others)
	r.Delivered, r.Missing, r.Others, r.Latencies = t.delivered, t.missing, t.others, t.lats
	r.Elapsed = time.Since(begin)
	if t.missing == 0 {
		r.Elapsed = t.last.Sub(begin)
	}
	recv.mu.Lock()
	r.Duplicates, r.BadSignature = recv.dups, recv.badSig
	if r.FirstFailed == "" {
		r.FirstFailed = recv.bad
	}
	recv.mu.Unlock()
	return r, phase, nil
}

// registerWebhook creates a webhook for every settlement (open mode: no payTo) and returns its id
// and secret.
func (p *poster) registerWebhook(ctx context.Context, target string) (id, secret string, err error) {
	body, _ := json.Marshal(map[string]any{"url": target})
	var res struct {
		ID, Secret string
		Error      string `json:"error"`
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	status, _, err := p.post(rctx, "/v1/webhooks", body, &res)
	switch {
	case err != nil:
		return "", "", fmt.Errorf("registering the bench's webhook: %w", err)
	case status != http.StatusCreated || res.ID == "" || res.Secret == "":
		return "", "", fmt.Errorf("registering the bench's webhook: HTTP %d %s", status, res.Error)
	}
	return res.ID, res.Secret, nil
}

func (p *poster) deleteWebhook(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, p.base+"/v1/webhooks/"+id, nil)
	if err != nil {
		return err
	}
	res, err := p.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		return errors.New("deleting the bench's webhook: HTTP " + strconv.Itoa(res.StatusCode))
	}
	return nil
}

// extraMsPerOp is a role's CPU per operation of phase beyond what base (a phase of baseOps-like
// operations, here settlements) costs for the baseOps of them phase also did: the webhook
// phase's CPU minus its settlements at the settle phase's rate, per delivered event. It is the
// difference of two measurements, so it is noisy, and may come out below zero when dispatch
// costs less than the settle phases differ by.
func extraMsPerOp(phase, base *CPUPhase, baseOps int, role string) (float64, bool) {
	all, ok := phase.MsPerOp(role)
	per, bok := base.MsPerOp(role)
	if !ok || !bok {
		return 0, false
	}
	return all - per*float64(baseOps)/float64(phase.Ops), true
}
