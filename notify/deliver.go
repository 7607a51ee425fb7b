package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Headers of a webhook POST.
const (
	HeaderEventID   = "X402-Event-Id"
	HeaderTimestamp = "X402-Timestamp"
	HeaderSignature = "X402-Signature"
)

const (
	// dbTimeout bounds one statement of the loop.
	dbTimeout = 10 * time.Second
	// statusTimeout bounds reading a settlement's status for a message (a ledger read and a head).
	statusTimeout = 5 * time.Second
	// enqueueBatch is how many events one webhook's cursor moves over per statement.
	enqueueBatch = 500
	// maxRounds bounds the work of one poll, so that a backlog is worked off tick by tick
	// instead of in one unbounded burst.
	maxRounds = 10
	// maxErrorText bounds what is kept of a failed attempt's error.
	maxErrorText = 500
)

// run is the delivery loop: each tick, turn new events into deliveries, then start sending what
// is due into the free delivery slots.
func (d *Dispatcher) run(ctx context.Context) {
	defer close(d.done)
	defer d.inflight.Wait()
	t := time.NewTicker(d.cfg.PollInterval)
	defer t.Stop()
	for {
		d.poll(ctx)
		if d.cfg.Observer != nil {
			d.cfg.Observer.Beat(LoopWebhooks, "", d.cfg.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.wake:
		}
	}
}

func (d *Dispatcher) poll(ctx context.Context) {
	states := EventStates()
	for range maxRounds {
		qctx, cancel := context.WithTimeout(ctx, dbTimeout)
		more, err := d.store.EnqueueWebhookEvents(qctx, states, enqueueBatch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.log.WarnContext(ctx, "webhooks: reading new settlement events failed; retrying next tick", "err", err)
			}
			break
		}
		if !more {
			break
		}
	}
	for range maxRounds {
		ended := d.ended.Load()
		free := d.cfg.Concurrency - int(d.sending.Load())
		if free <= 0 {
			// Every slot is busy and more may be due: the next attempt to end wakes the loop.
			d.backlog.Store(true)
			return
		}
		n, err := d.startDue(ctx, free)
		if err != nil {
			d.backlog.Store(false)
			if ctx.Err() == nil {
				d.log.WarnContext(ctx, "webhooks: claiming due deliveries failed; retrying next tick", "err", err)
			}
			return
		}
		if n == 0 {
			// (A claim short of the free slots may have met a webhook's cap: the next round
			// passes that webhook over and finds the others' due deliveries.) Nothing more is
			// due beyond the shares in flight; but where a share is full, more of its deliveries
			// may be due, and the attempt that frees it must claim them at once, or a webhook's
			// backlog moves at PerWebhook per PollInterval (4/s by default: the load bench
			// delivered 496 of 3,000 events in two minutes).
			d.backlog.Store(d.shareFull())
			if d.ended.Load() != ended {
				continue // an attempt ended meanwhile, perhaps before it could see the backlog
			}
			return
		}
	}
	d.backlog.Store(true)
}

// lease is how long a claimed attempt stays hidden from other replicas: longer than the attempt
// can take (status read, POST, record), so two replicas never send the same attempt at once,
// yet short enough that an attempt lost with its process is retried soon.
func (d *Dispatcher) lease() time.Duration {
	return statusTimeout + d.cfg.SendTimeout + dbTimeout + 40*time.Second
}

// startDue claims up to limit due deliveries and sends each in its own goroutine, which records
// the outcome; a delivery whose endpoint's breaker is open is deferred instead (its attempt given
// back). It returns how many it claimed.
func (d *Dispatcher) startDue(ctx context.Context, limit int) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	batch, err := d.store.ClaimWebhookDeliveries(qctx, d.claim(limit))
	cancel()
	if err != nil {
		return 0, err
	}
	var deferred []facilitator.DeliveryAttempt
	for _, del := range batch {
		ep := endpointOf(del.Owner, del.URL)
		if ok, retryIn := d.admit(del, ep); !ok {
			deferred = append(deferred, facilitator.DeliveryAttempt{WebhookID: del.WebhookID, EventID: del.Event.ID,
				Deferred: true, RetryIn: retryIn})
			continue
		}
		d.inflight.Add(1)
		d.sending.Add(1)
		go func() {
			defer d.inflight.Done()
			defer d.sending.Add(-1)
			a, o := d.attempt(ctx, del)
			if ctx.Err() == nil { // an attempt Stop cut short says nothing about the receiver
				d.observe(a)
			} else {
				o = endpointUnknown
			}
			d.release(del, ep, o)
			// Recorded even when Stop cut the attempt short, so it is retried without waiting for
			// its claim to lapse.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
			defer cancel()
			if err := d.store.RecordWebhookAttempt(rctx, a); err != nil {
				d.log.WarnContext(ctx, "webhooks: recording an attempt failed; it is retried once its claim lapses",
					"webhook", del.WebhookID, "event", del.Event.ID, "err", err)
			}
			// A slot is free: with a backlog, claim the next delivery now rather than at the next
			// tick, or a full claim would cap delivery at Concurrency per PollInterval (16/s by
			// default, below what one signer settles).
			d.ended.Add(1)
			if d.backlog.Load() {
				select {
				case d.wake <- struct{}{}:
				default:
				}
			}
		}()
	}
	for _, a := range deferred {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
		if err := d.store.RecordWebhookAttempt(rctx, a); err != nil {
			// Its claim lapses after the lease; it is claimed (and deferred) again then.
			d.log.WarnContext(ctx, "webhooks: deferring a delivery to a failing endpoint failed",
				"webhook", a.WebhookID, "event", a.EventID, "err", err)
		}
		cancel()
	}
	return len(batch), nil
}

// shareFull reports whether a webhook or an owner holds all of its share of the slots.
func (d *Dispatcher) shareFull() bool {
	d.busyMu.Lock()
	defer d.busyMu.Unlock()
	for _, n := range d.busy {
		if n >= d.cfg.PerWebhook {
			return true
		}
	}
	for _, n := range d.owners {
		if n >= d.cfg.PerOwner {
			return true
		}
	}
	return false
}

// claim is what the next claim may take: limit deliveries within the shares that those in flight
// leave, none of a webhook whose endpoint's breaker is open.
func (d *Dispatcher) claim(limit int) facilitator.DeliveryClaim {
	d.busyMu.Lock()
	defer d.busyMu.Unlock()
	now := d.cfg.Now()
	var skip []string
	for id, ep := range d.failing {
		switch {
		case !d.breakers.known(ep):
			delete(d.failing, id) // closed again
		case d.breakers.blocked(ep, now):
			skip = append(skip, id)
		}
	}
	return facilitator.DeliveryClaim{Limit: limit, PerWebhook: d.cfg.PerWebhook, PerOwner: d.cfg.PerOwner,
		BusyWebhooks: maps.Clone(d.busy), BusyOwners: maps.Clone(d.owners), Skip: skip, Lease: d.lease()}
}

// admit decides whether a claimed delivery is attempted now (it then holds its webhook's and its
// owner's share until done), or deferred for retryIn because its endpoint's breaker is open.
func (d *Dispatcher) admit(del facilitator.WebhookDelivery, ep string) (ok bool, retryIn time.Duration) {
	d.busyMu.Lock()
	defer d.busyMu.Unlock()
	now := d.cfg.Now()
	ok, at := d.breakers.allow(ep, now)
	if d.breakers.known(ep) {
		d.failing[del.WebhookID] = ep
	}
	if !ok {
		return false, max(at.Sub(now), 0)
	}
	d.busy[del.WebhookID]++
	d.owners[del.Owner]++
	return true, 0
}

// release ends an admitted delivery's hold on the shares, and tells its endpoint's breaker how the
// attempt went.
func (d *Dispatcher) release(del facilitator.WebhookDelivery, ep string, o breakerOutcome) {
	d.busyMu.Lock()
	defer d.busyMu.Unlock()
	if d.busy[del.WebhookID]--; d.busy[del.WebhookID] <= 0 {
		delete(d.busy, del.WebhookID)
	}
	if d.owners[del.Owner]--; d.owners[del.Owner] <= 0 {
		delete(d.owners, del.Owner)
	}
	now := d.cfg.Now()
	was := d.breakers.blocked(ep, now)
	d.breakers.result(ep, now, o)
	if d.breakers.known(ep) {
		d.failing[del.WebhookID] = ep
		if !was && d.breakers.blocked(ep, now) {
			d.log.Warn("webhooks: an endpoint keeps failing; its deliveries wait, without spending their attempts, until a probe succeeds",
				"api_key", del.Owner, "host", hostOf(del.URL), "probe_at", d.breakers.m[ep].until)
		}
	}
}

// attempt sends one delivery and decides what follows: done, retry after a backoff, or give up.
func (d *Dispatcher) attempt(ctx context.Context, del facilitator.WebhookDelivery) (facilitator.DeliveryAttempt, breakerOutcome) {
	a := facilitator.DeliveryAttempt{WebhookID: del.WebhookID, EventID: del.Event.ID}
	status, err := d.send(ctx, del)
	a.HTTPStatus = status
	o := outcome(status, err)
	switch {
	case err != nil:
		a.Error = clip(err.Error())
	case status >= 200 && status < 300:
		a.Delivered = true
		d.log.DebugContext(ctx, "webhook delivered", "webhook", del.WebhookID, "event", del.Event.ID,
			"state", del.Event.State, "attempt", del.Attempt, "status", status)
		return a, o
	default:
		a.Error = fmt.Sprintf("the receiver answered HTTP %d", status)
	}
	attrs := []any{"webhook", del.WebhookID, "host", hostOf(del.URL), "event", del.Event.ID, "state", del.Event.State,
		"settlement", del.Event.SettlementID, "attempt", del.Attempt, "status", status, "err", a.Error}
	if del.Attempt >= d.cfg.MaxAttempts {
		a.GiveUp = true
		d.log.ErrorContext(ctx, "webhook delivery GIVEN UP: the merchant will not hear of this event from us", attrs...)
		return a, o
	}
	a.RetryIn = backoff(d.cfg.BaseBackoff, d.cfg.MaxBackoff, del.Attempt)
	d.log.WarnContext(ctx, "webhook delivery failed; retrying", append(attrs, "retry_in", a.RetryIn)...)
	return a, o
}

// errNoStatus marks an attempt that ended before the POST: the settlement's status could not be
// read. It says nothing about the endpoint.
var errNoStatus = errors.New("reading the settlement's status")

// outcome is what an attempt's answer says about its endpoint: down when it did not answer (in
// time, or at all) or answered 5xx or 429; up when it answered anything else.
func outcome(status int, err error) breakerOutcome {
	switch {
	case errors.Is(err, errNoStatus):
		return endpointUnknown
	case err != nil, status >= 500, status == http.StatusTooManyRequests:
		return endpointDown
	}
	return endpointUp
}

func (d *Dispatcher) observe(a facilitator.DeliveryAttempt) {
	if d.cfg.Observer == nil {
		return
	}
	switch {
	case a.Delivered:
		d.cfg.Observer.WebhookAttempt(DeliveryDelivered)
	case a.GiveUp:
		d.cfg.Observer.WebhookAttempt(DeliveryGaveUp)
	default:
		d.cfg.Observer.WebhookAttempt(DeliveryRetrying)
	}
}

// send POSTs the event, signed, and returns the receiver's HTTP status.
func (d *Dispatcher) send(ctx context.Context, del facilitator.WebhookDelivery) (int, error) {
	st, err := d.statusOf(ctx, del.Key, del.PaymentID)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errNoStatus, err)
	}
	body, err := json.Marshal(message(del.Event, st))
	if err != nil {
		return 0, err
	}
	ts := d.cfg.Now().Unix()
	sctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodPost, del.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "x402-facilitator-webhooks/1")
	req.Header.Set(HeaderEventID, strconv.FormatInt(del.Event.ID, 10))
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, signature(del.Secret, ts, body))
	res, err := d.client.Do(req)
	if err != nil {
		// A *url.Error repeats the URL, whose path and query may hold a merchant's token: only
		// the cause goes to the ledger and the logs.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, err
	}
	defer res.Body.Close()
	// Drain a bounded amount so the connection can be reused; what the receiver says is ignored.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	return res.StatusCode, nil
}

// statusOf reads the settlement's status now: messages carry the latest word, not the event's.
func (d *Dispatcher) statusOf(ctx context.Context, key facilitator.AuthorizationKey, paymentID string) (facilitator.AuthorizationStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, _, err := d.status.Authorization(ctx, key)
	if err != nil {
		return st, err
	}
	if paymentID != "" {
		st.PaymentID = paymentID
	}
	return st, nil
}

func message(ev facilitator.SettlementEvent, st facilitator.AuthorizationStatus) Message {
	return Message{ID: strconv.FormatInt(ev.ID, 10), Type: "settlement." + string(ev.State), CreatedAt: ev.At.UTC(),
		Data: st, State: string(ev.State), SettlementID: ev.SettlementID}
}

// signature is the X402-Signature value: HMAC-SHA256 keyed with the secret's text (as shown at
// registration) over "<timestamp>.<body>". Binding the timestamp lets a receiver refuse a
// replayed old delivery; binding the body, any change to it.
func signature(secret string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(ts, 10)))
	mac.Write([]byte("."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// ValidSignature reports whether header (an X402-Signature value) signs ts and body with secret:
// what a receiver checks, in constant time, before trusting a delivery.
func ValidSignature(secret string, ts int64, body []byte, header string) bool {
	return hmac.Equal([]byte(signature(secret, ts, body)), []byte(header))
}

// backoff is the wait after the attempt-th failed attempt: base, 2·base, 4·base, … up to max.
func backoff(base, max time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// newClient is the webhook sender: every step bounded by timeout, no redirects (a 3xx would turn
// the POST into a GET, or lead where the URL check never looked), no proxy from the environment
// (the dial check must see the real target), and, unless allowPrivate, only public addresses
// dialled: the check runs on the resolved address, so a name that resolves inward is refused too.
func newClient(timeout time.Duration, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if !publicAddr(ap.Addr()) {
				return fmt.Errorf("webhook target %s is not a public address", ap.Addr())
			}
			return nil
		}
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   timeout,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func clip(s string) string {
	if len(s) > maxErrorText {
		return s[:maxErrorText] + "…"
	}
	return s
}
