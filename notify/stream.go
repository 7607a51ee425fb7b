package notify

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Target is what a stream follows: an authorization, or a payment-identifier id.
type Target struct {
	Key facilitator.AuthorizationKey
	// PaymentID, when set, names the settlement instead of Key, within IDScope (the API key that
	// sent the id; "" in open mode), as payment ids are scoped everywhere else.
	PaymentID string
	IDScope   string
	// Owner is the API key that opens the stream ("" in open mode): the stream holds one of the
	// key's MaxStreamsPerKey slots.
	Owner string
}

// Frame is one server-sent event. A frame with only a Comment is a keep-alive.
type Frame struct {
	// ID is the resume point a client sends back as Last-Event-ID.
	ID      string
	Event   string
	Data    []byte
	Comment string
}

// streamBatch is how many events one stream poll reads.
const streamBatch = 100

// Stream follows one settlement's events. Run it once; Close it if it is not run.
type Stream struct {
	d          *Dispatcher
	owner      string
	settlement *facilitator.Settlement
	paymentID  string
	after      int64
	resume     bool
	closeOnce  sync.Once
}

// OpenStream finds the settlement t names (facilitator.ErrNotFound when the ledger has none) and
// takes one of the MaxStreams slots, within t.Owner's MaxStreamsPerKey. lastEventID, the Last-Event-ID a reconnecting client sends,
// resumes after that event; empty opens with a snapshot of the current status.
func (d *Dispatcher) OpenStream(ctx context.Context, t Target, lastEventID string) (_ *Stream, err error) {
	s := &Stream{d: d, owner: t.Owner, paymentID: t.PaymentID}
	if lastEventID != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(lastEventID), 10, 64)
		if err != nil || n < 0 {
			return nil, facilitator.Errorf(facilitator.EInvalid, "invalid_last_event_id", "Last-Event-ID must be an event id (a decimal number)")
		}
		s.after, s.resume = n, true
	}
	// The slot first: past the bound, a request costs no query.
	if err := d.reserveStream(t.Owner); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if t.PaymentID != "" {
		var rec *facilitator.PaymentIDRecord
		if rec, err = d.store.PaymentID(ctx, t.IDScope, t.PaymentID); err == nil {
			s.settlement = rec.Settlement
		}
	} else {
		s.settlement, err = d.store.SettlementByKey(ctx, t.Key)
	}
	if errors.Is(err, facilitator.ErrNotFound) {
		return nil, facilitator.ErrNotFound
	}
	if err != nil {
		return nil, unavailable(err)
	}
	if !s.resume {
		// The snapshot is read after this id, so it is at least as fresh as every event up to
		// it: a client resuming from the snapshot misses nothing and repeats little.
		if s.after, err = d.store.LastSettlementEvent(ctx, s.settlement.ID); err != nil {
			return nil, unavailable(err)
		}
	}
	return s, nil
}

func (d *Dispatcher) reserveStream(owner string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return facilitator.Unavailable("notifications_unavailable", "the facilitator is shutting down, reconnect", errClosed)
	}
	return d.streams.Take(owner)
}

// Close gives the stream's slot back. Run closes it too; more calls do nothing.
func (s *Stream) Close() {
	s.closeOnce.Do(func() { s.d.streams.Give(s.owner) })
}

// Run sends the snapshot (unless resuming), then every new event of the settlement as it is
// written, and a keep-alive comment when idle, until ctx ends, the stream's lifetime is over, the
// Dispatcher stops, or send fails (the client left). Events are those of EventStates, in order.
func (s *Stream) Run(ctx context.Context, send func(Frame) error) error {
	defer s.Close()
	d := s.d
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StreamLifetime)
	defer cancel()
	if !s.resume {
		st, err := d.statusOf(ctx, s.settlement.Key, s.paymentID)
		if err != nil {
			return err
		}
		body, err := json.Marshal(Message{ID: strconv.FormatInt(s.after, 10), Type: "status", CreatedAt: d.cfg.Now().UTC(),
			Data: st, State: string(s.settlement.State), SettlementID: s.settlement.ID})
		if err != nil {
			return err
		}
		if err := send(Frame{ID: strconv.FormatInt(s.after, 10), Event: "status", Data: body}); err != nil {
			return err
		}
	}
	if err := s.forward(ctx, send); err != nil {
		return err
	}
	poll := time.NewTicker(d.cfg.StreamPoll)
	defer poll.Stop()
	keep := time.NewTicker(d.cfg.KeepAlive)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.closed:
			return nil
		case <-keep.C:
			if err := send(Frame{Comment: "keep-alive"}); err != nil {
				return err
			}
		case <-poll.C:
			if err := s.forward(ctx, send); err != nil {
				return err
			}
		}
	}
}

// forward sends the events written since the last one sent. Within one settlement, event ids
// follow commit order for every state streamed (each transition updates the settlement's row,
// which serialises them), so a cursor on the id alone skips nothing here.
func (s *Stream) forward(ctx context.Context, send func(Frame) error) error {
	d := s.d
	for {
		qctx, cancel := context.WithTimeout(ctx, dbTimeout)
		evs, err := d.store.SettlementEvents(qctx, s.settlement.ID, s.after, EventStates(), streamBatch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				// The ledger may be back by the next poll; the stream stays open meanwhile.
				d.log.WarnContext(ctx, "event stream: reading events failed", "settlement", s.settlement.ID, "err", err)
			}
			return nil
		}
		if len(evs) == 0 {
			return nil
		}
		st, err := d.statusOf(ctx, s.settlement.Key, s.paymentID)
		if err != nil {
			if ctx.Err() == nil {
				d.log.WarnContext(ctx, "event stream: reading the status failed", "settlement", s.settlement.ID, "err", err)
			}
			return nil
		}
		for _, ev := range evs {
			body, err := json.Marshal(message(ev, st))
			if err != nil {
				return err
			}
			id := strconv.FormatInt(ev.ID, 10)
			if err := send(Frame{ID: id, Event: "settlement." + string(ev.State), Data: body}); err != nil {
				return err
			}
			s.after = ev.ID
		}
		if len(evs) < streamBatch {
			return nil
		}
	}
}

func unavailable(err error) error {
	return facilitator.Unavailable("notifications_unavailable", "the ledger is unavailable, retry", err)
}
