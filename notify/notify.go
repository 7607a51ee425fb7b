// Package notify tells merchants when their settlements change state: signed webhooks delivered
// at least once from the settlement_events outbox, and server-sent-event streams of the same
// events for one authorization or payment id. Nothing here runs on the request path of /settle:
// that path only writes settlement_events, and the Dispatcher reads them in the background.
package notify

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Store is what notify reads and writes in Postgres.
type Store interface {
	// InsertWebhook stores w (its CreatedAt is set) unless w.Owner has limit webhooks enabled
	// already; ok is false then. A new webhook hears only events written after it.
	InsertWebhook(ctx context.Context, w *facilitator.Webhook, limit int) (ok bool, err error)
	// Webhooks lists owner's enabled webhooks, without their secrets.
	Webhooks(ctx context.Context, owner string) ([]facilitator.Webhook, error)
	// DisableWebhook stops one of owner's webhooks and what it is still owed;
	// facilitator.ErrNotFound if unknown or another owner's.
	DisableWebhook(ctx context.Context, owner, id string) error
	// EnqueueWebhookEvents moves every enabled webhook's cursor over up to limit new events,
	// recording a delivery for each that has one of states and matches its payTo filter. more
	// reports that some webhook had limit events to read: call again.
	EnqueueWebhookEvents(ctx context.Context, states []string, limit int) (more bool, err error)
	// ClaimWebhookDeliveries takes up to c.Limit due deliveries for one attempt each, hiding them
	// from other claimers for c.Lease: of each webhook and each owner no more than its share less
	// what is in flight here, the owners served in turns (the fewest in flight first, then oldest
	// due), and none of the webhooks in c.Skip.
	ClaimWebhookDeliveries(ctx context.Context, c facilitator.DeliveryClaim) ([]facilitator.WebhookDelivery, error)
	// RecordWebhookAttempt stores an attempt's outcome.
	RecordWebhookAttempt(ctx context.Context, a facilitator.DeliveryAttempt) error
	// PruneWebhookDeliveries deletes up to limit deliveries that were delivered or given up
	// before before, and reports how many.
	PruneWebhookDeliveries(ctx context.Context, before time.Time, limit int) (int64, error)

	SettlementByKey(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error)
	PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error)
	// SettlementEvents lists a settlement's events after the id after with one of states, oldest first.
	SettlementEvents(ctx context.Context, settlementID, after int64, states []string, limit int) ([]facilitator.SettlementEvent, error)
	// LastSettlementEvent is the id of a settlement's latest event of any state (0: none).
	LastSettlementEvent(ctx context.Context, settlementID int64) (int64, error)
}

// Status answers what an authorization's settlement looks like now (status.Service): the data
// every event carries.
type Status interface {
	Authorization(ctx context.Context, key facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error)
}

// Message is an event as merchants receive it: the body of a webhook POST, and the data of an
// event-stream message.
type Message struct {
	// ID is the settlement_events id, as a string: the same on every retry, so receivers dedupe on it.
	ID string `json:"id"`
	// Type is "settlement.<state>", or "status" for a stream's opening snapshot.
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"createdAt"`
	// Data is the settlement's status when the message was sent (not when the event happened):
	// a late or retried delivery carries the latest word.
	Data facilitator.AuthorizationStatus `json:"data"`
	// State is the transition's ledger state (the settlement's current one in a snapshot).
	State        string `json:"state"`
	SettlementID int64  `json:"settlementId"`
}

// EventStates are the ledger states whose transitions merchants hear about. signed (not yet sent)
// and bumped (a fee replacement) change nothing for a merchant; broadcast is also the state a
// reorg moves a mined settlement back to, which a merchant must hear.
func EventStates() []string {
	return []string{
		string(facilitator.StateBroadcast), string(facilitator.StateMined), string(facilitator.StateFinal),
		string(facilitator.StateReverted), string(facilitator.StateExpired), string(facilitator.StateSettledElsewhere),
		string(facilitator.StateCanceled),
	}
}

// Config configures the Dispatcher. Zero values take the defaults in brackets.
type Config struct {
	Store  Store
	Status Status

	// PollInterval is how often new events and due deliveries are looked for [1s].
	PollInterval time.Duration
	// SendTimeout bounds one webhook POST, answer included [5s].
	SendTimeout time.Duration
	// BaseBackoff is the wait after the first failed attempt; it doubles after each [1s].
	BaseBackoff time.Duration
	// MaxBackoff caps the wait between attempts [10m].
	MaxBackoff time.Duration
	// MaxAttempts is when a delivery is given up, loudly [20].
	MaxAttempts int
	// Concurrency is how many deliveries may be in flight at once [16]. A slow receiver holds
	// one slot per delivery until SendTimeout, never the whole loop.
	Concurrency int
	// PerWebhook is how many of one webhook's deliveries may be in flight at once
	// [Concurrency/4, at least 1]: an unreachable receiver that owes a backlog holds that many
	// slots, never the others' (its deliveries are the oldest due, and would take every slot).
	PerWebhook int
	// PerOwner is how many deliveries of one owner's webhooks together (an API key's; open mode
	// is one owner) may be in flight at once [Concurrency/2, at least 1]: a merchant with many
	// failing webhooks holds that many slots, and the others' deliveries take the rest (and a
	// merchant's one failing webhook, PerWebhook, leaves room for its others). Claims
	// serve the owners in turns, so one owner's backlog never pushes another's fresh delivery
	// back. Shares are per replica: with n replicas an owner holds at most n·PerOwner.
	PerOwner int
	// BreakerFailures is how many failed attempts in a row (no answer in SendTimeout, a refused
	// connection, a 5xx or a 429) open an endpoint's circuit breaker [5]. An endpoint is one
	// owner's webhooks at one scheme, host and port. While open, its deliveries are not attempted
	// (they wait, and their attempts are not spent); after the cool-down one probe is sent, and a
	// success closes it. The breakers are this replica's, in memory.
	BreakerFailures int
	// BreakerCooldown is how long an endpoint stays open the first time; each failed probe
	// doubles it, up to MaxBackoff [30s].
	BreakerCooldown time.Duration
	// MaxWebhooks bounds the enabled webhooks of one owner (an API key, or open mode): each costs
	// every poll, and one merchant must not use up another's room [100].
	MaxWebhooks int
	// DeliveryRetention is how long finished deliveries (delivered or given up) are kept, for
	// their history, before Prune deletes them [720h].
	DeliveryRetention time.Duration
	// AllowPrivateTargets lets webhooks point at loopback, private and link-local addresses
	// (local development, tests). Off, such targets are refused at registration and at dial time,
	// so a webhook cannot be used to reach the facilitator's own network.
	AllowPrivateTargets bool

	// StreamPoll is how often an event stream looks for new events [500ms].
	StreamPoll time.Duration
	// KeepAlive is how often an idle stream sends a comment, so proxies keep it open [15s].
	KeepAlive time.Duration
	// StreamLifetime ends a stream after this long; clients reconnect with Last-Event-ID [10m].
	StreamLifetime time.Duration
	// MaxStreams bounds the open streams; past it a new one answers 503 too_many_streams [1000].
	MaxStreams int
	// MaxStreamsPerKey bounds one owner's open streams within MaxStreams (an API key; open mode is
	// one owner); past it the owner's next answers 429 too_many_streams_for_key, and other keys
	// still get theirs [100].
	MaxStreamsPerKey int

	Now    func() time.Time
	Logger *slog.Logger
	// Observer hears each delivery attempt's result and each round of the loop; nil: nobody.
	Observer Observer
}

// Observer hears webhook delivery attempts (metrics); it must not block.
type Observer interface {
	// WebhookAttempt: one attempt ended with result DeliveryDelivered, DeliveryRetrying or
	// DeliveryGaveUp.
	WebhookAttempt(result string)
	// Beat: loop (LoopWebhooks) finished a round at at (network is "": deliveries are not per
	// network). A stuck dispatcher stops beating.
	Beat(loop, network string, at time.Time)
}

// LoopWebhooks is the delivery loop, as it beats.
const LoopWebhooks = "webhooks"

// Delivery attempt results.
const (
	DeliveryDelivered = "delivered"
	DeliveryRetrying  = "failed_retrying"
	DeliveryGaveUp    = "gave_up"
)

// errClosed is returned for work asked of a stopped Dispatcher.
var errClosed = errors.New("notify: dispatcher stopped")

// Dispatcher delivers webhooks in the background, and serves webhook registration and event
// streams to the API.
type Dispatcher struct {
	cfg    Config
	store  Store
	status Status
	client *http.Client
	log    *slog.Logger

	inflight sync.WaitGroup // deliveries being sent
	sending  atomic.Int64   // how many
	busyMu   sync.Mutex
	busy     map[string]int // of them, by webhook id
	owners   map[string]int // and by owner
	breakers *breakers      // the endpoints', under busyMu
	// failing is the endpoint of each webhook seen at an endpoint whose breaker is not closed:
	// the webhooks a claim passes over while it is open.
	failing map[string]string
	// backlog is set when the loop's last claim filled every free slot, or a webhook's or an
	// owner's share (more may be due); wake is how an ending attempt then calls the loop back
	// before its next tick. ended counts ended attempts, so that the loop can tell that a share
	// freed while it decided there was no backlog.
	backlog atomic.Bool
	wake    chan struct{}
	ended   atomic.Int64

	streams *facilitator.Slots
	mu      sync.Mutex
	closed  chan struct{} // closed by Stop: ends the loop and every stream
	stopped bool
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when the loop has returned
}

// New builds a Dispatcher; Start runs its delivery loop.
func New(cfg Config) *Dispatcher {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PollInterval, time.Second)
	def(&cfg.SendTimeout, 5*time.Second)
	def(&cfg.BaseBackoff, time.Second)
	def(&cfg.MaxBackoff, 10*time.Minute)
	def(&cfg.StreamPoll, 500*time.Millisecond)
	def(&cfg.KeepAlive, 15*time.Second)
	def(&cfg.StreamLifetime, 10*time.Minute)
	def(&cfg.DeliveryRetention, 30*24*time.Hour)
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 20
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.PerWebhook <= 0 {
		cfg.PerWebhook = max(1, cfg.Concurrency/4)
	}
	if cfg.PerOwner <= 0 {
		cfg.PerOwner = max(1, cfg.Concurrency/2)
	}
	if cfg.BreakerFailures <= 0 {
		cfg.BreakerFailures = 5
	}
	def(&cfg.BreakerCooldown, 30*time.Second)
	if cfg.MaxWebhooks <= 0 {
		cfg.MaxWebhooks = 100
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 1000
	}
	if cfg.MaxStreamsPerKey <= 0 {
		cfg.MaxStreamsPerKey = 100
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{cfg: cfg, store: cfg.Store, status: cfg.Status, log: cfg.Logger, closed: make(chan struct{}),
		busy: map[string]int{}, owners: map[string]int{}, failing: map[string]string{},
		// A probe's answer comes within its attempt: the status read and the POST.
		breakers: newBreakers(cfg.BreakerFailures, cfg.BreakerCooldown, cfg.MaxBackoff, statusTimeout+cfg.SendTimeout),
		wake:     make(chan struct{}, 1), client: newClient(cfg.SendTimeout, cfg.AllowPrivateTargets),
		streams: facilitator.NewSlots(cfg.MaxStreams, cfg.MaxStreamsPerKey)}
}

// Start runs the delivery loop until Stop.
func (d *Dispatcher) Start(_ context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return errClosed
	}
	if d.done != nil {
		return errors.New("notify: dispatcher already started")
	}
	// The loop outlives Start's context (a start-up deadline); Stop ends it.
	ctx, cancel := context.WithCancelCause(context.Background())
	d.cancel, d.done = cancel, make(chan struct{})
	go d.run(ctx)
	return nil
}

// Stop ends the delivery loop (attempts in flight are cut short, recorded, and retried later)
// and every open event stream, and waits for the loop. It may be called more than once.
func (d *Dispatcher) Stop() {
	d.mu.Lock()
	if !d.stopped {
		d.stopped = true
		close(d.closed)
		if d.cancel != nil {
			d.cancel(errClosed)
		}
	}
	done := d.done
	d.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Prune deletes finished deliveries older than DeliveryRetention, a bounded batch at a time, so
// the deliveries table does not grow with every settlement for ever. Deliveries still owed are
// never touched, and a webhook's cursor is its own (it never re-reads an event whose delivery was
// pruned). It returns how many it deleted.
func (d *Dispatcher) Prune(ctx context.Context) (int64, error) {
	before := d.cfg.Now().Add(-d.cfg.DeliveryRetention)
	var total int64
	for {
		n, err := d.cfg.Store.PruneWebhookDeliveries(ctx, before, 10_000)
		total += n
		if err != nil || n < 10_000 {
			return total, err
		}
	}
}
