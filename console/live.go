package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Live is what moves on an answer page, as the page shows it and as its event stream sends it
// (event "status"): everything in words is decided here, nothing in the browser.
type Live struct {
	State         string `json:"state"`
	StateText     string `json:"stateText"`
	Advice        string `json:"advice"`
	Transaction   string `json:"transaction"`
	Block         string `json:"block"`
	Confirmations string `json:"confirmations"`
	Final         bool   `json:"final"`
	FinalText     string `json:"finalText"`
	Finality      string `json:"finality"`
	Head          string `json:"head"`
}

const none = "—"

func liveOf(st facilitator.AuthorizationStatus) Live {
	l := Live{State: st.State, StateText: st.State, Advice: facilitator.StatusAdvice(st.State), Transaction: orNone(st.Transaction),
		Block: none, Confirmations: none, Final: st.Final, FinalText: "not final yet", Head: fmt.Sprint(st.Head)}
	if st.SettledBy != "" {
		l.StateText += " (by " + st.SettledBy + ")"
	}
	if st.BlockNumber > 0 {
		l.Block, l.Confirmations = fmt.Sprint(st.BlockNumber), fmt.Sprint(st.Confirmations)
	} else {
		l.FinalText = "not on chain"
	}
	if st.Final {
		l.FinalText = "final"
	}
	l.Finality = st.Finality.Rule
	if st.Finality.FinalBlock > 0 {
		l.Finality += fmt.Sprintf(", final up to block %d", st.Finality.FinalBlock)
	} else if l.Finality != "" {
		l.Finality += ", no block known final"
	}
	return l
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

// keepAlive is how often an idle stream sends a comment, so that proxies keep it open.
const keepAlive = 15 * time.Second

// Heads announces a network's new heads: the process's one head subscription of the network
// (ethrpc.Heads), shared with the settlement engine and the indexer.
type Heads interface {
	// Follow calls fn with each new head until ctx ends; fn(0) says heads may have been missed.
	Follow(ctx context.Context, fn func(head uint64))
	// Subscribed reports whether announcements flow now.
	Subscribed() bool
}

// events streams an authorization's Live whenever it changes: first at once, then as its lookup's
// shared reader reads it again, until StreamFor has passed (the browser reconnects) or the answer
// is final. Each stream holds one of the key's slots (MaxStreamsPerKey, within MaxStreams).
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	owner, _ := r.Context().Value(scopeKey{}).(string)
	if err := c.live.slots.Take(owner); err != nil {
		c.refuseStream(w, err)
		return
	}
	defer c.live.slots.Give(owner)
	l, wake := c.live.join(key)
	defer c.live.leave(key, l, wake)
	end := time.NewTimer(c.cfg.StreamFor)
	defer end.Stop()
	select {
	case <-r.Context().Done():
		return
	case <-end.C:
		return
	case <-wake:
	}
	first, err := c.live.latest(l)
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		c.errorPage(w, r, "", fmt.Errorf("console: the response cannot stream"))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(l Live) bool {
		b, _ := json.Marshal(l)
		_, err := fmt.Fprintf(w, "event: status\ndata: %s\n\n", b)
		fl.Flush()
		return err == nil
	}
	if !send(first) || first.Final {
		return
	}
	last, sent := first, false
	keep := time.NewTicker(keepAlive)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-keep.C:
			if !sent {
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return
				}
				fl.Flush()
			}
			sent = false
		case <-wake:
			// A failed read says nothing new: the page keeps what it shows.
			if now, err := c.live.latest(l); err == nil && now != last {
				last, sent = now, true
				if !send(now) || now.Final {
					return
				}
			}
		}
	}
}

// refuseStream answers a live stream past its key's share or the console's bound (the browser's
// EventSource gives up; the page keeps what it showed).
func (c *Console) refuseStream(w http.ResponseWriter, err error) {
	code := c.cfg.HTTPStatus(err)
	w.Header().Set("Retry-After", "5")
	title, msg := "Too many live pages", "This key has too many live pages open: close some, or reload in a few seconds."
	if code != http.StatusTooManyRequests {
		title, msg = "Temporarily unavailable", "Too many live pages are open right now: reload in a few seconds."
	}
	c.render(w, code, "error", page{Title: title, Error: &errorView{Status: code, Title: title, Message: msg}})
}

// lookups shares one reader among the live streams of one authorization: the first viewer starts
// it, later ones take what it last read, and the last to leave stops it, so that N viewers cost
// one status read per head of the chain (or per Poll), not N.
type lookups struct {
	c     *Console
	slots *facilitator.Slots
	// ticks paces the readers that poll (tests replace it).
	ticks func(time.Duration) (<-chan time.Time, func())

	mu      sync.Mutex
	readers map[facilitator.AuthorizationKey]*lookup
}

// lookup is one authorization's reader and what it last read; lookups.mu guards it.
type lookup struct {
	viewers map[chan struct{}]struct{} // each is woken (never blocking) when a read is published
	live    Live                       // the last successful read
	err     error                      // set only while no read has succeeded yet
	reads   int                        // reads published; 0: none yet
	stop    context.CancelFunc
}

func newLookups(c *Console, maxStreams, perKey int) *lookups {
	if maxStreams <= 0 {
		maxStreams = 1000
	}
	if perKey <= 0 {
		perKey = 100
	}
	return &lookups{c: c, slots: facilitator.NewSlots(maxStreams, perKey), readers: map[facilitator.AuthorizationKey]*lookup{},
		ticks: func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}}
}

// join adds a viewer of key, starting its reader if it is the first; wake fires when a read is
// published, at once if one already was.
func (ls *lookups) join(key facilitator.AuthorizationKey) (_ *lookup, wake chan struct{}) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.readers[key]
	if l == nil {
		// The reader outlives the viewer that started it: it ends with the last one.
		ctx, stop := context.WithCancel(context.Background())
		l = &lookup{viewers: map[chan struct{}]struct{}{}, stop: stop}
		ls.readers[key] = l
		go ls.run(ctx, key, l)
	}
	wake = make(chan struct{}, 1)
	l.viewers[wake] = struct{}{}
	if l.reads > 0 {
		wake <- struct{}{}
	}
	return l, wake
}

// leave removes a viewer; the last one stops the reader.
func (ls *lookups) leave(key facilitator.AuthorizationKey, l *lookup, wake chan struct{}) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(l.viewers, wake)
	if len(l.viewers) == 0 {
		l.stop()
		if ls.readers[key] == l {
			delete(ls.readers, key)
		}
	}
}

// latest is what l last read: the last successful read, or the error while none has succeeded.
func (ls *lookups) latest(l *lookup) (Live, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return l.live, l.err
}

// publish hands a read to l's viewers. A failure after a success publishes nothing: the pages keep
// what they show.
func (ls *lookups) publish(l *lookup, live Live, err error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if err != nil && l.reads > 0 && l.err == nil {
		return
	}
	l.live, l.err = live, err
	l.reads++
	for wake := range l.viewers {
		select {
		case wake <- struct{}{}:
		default: // already woken: it reads the latest
		}
	}
}

// run reads key's status at once, then when its network's head passes the one last read (the
// shared subscription's announcements), else on Poll ticks (pollDue), until the answer is final or
// ctx ends.
func (ls *lookups) run(ctx context.Context, key facilitator.AuthorizationKey, l *lookup) {
	c := ls.c
	heads := c.cfg.Heads[key.Network]
	var announced atomic.Uint64 // the highest head announced
	var missed atomic.Bool      // the subscription restarted: heads may have been missed
	headed := make(chan struct{}, 1)
	if heads != nil {
		go heads.Follow(ctx, func(n uint64) {
			if n == 0 {
				missed.Store(true)
			}
			for {
				if old := announced.Load(); n <= old || announced.CompareAndSwap(old, n) {
					break
				}
			}
			select {
			case headed <- struct{}{}:
			default:
			}
		})
	}
	ticks, stopTicks := ls.ticks(c.cfg.Poll)
	defer stopTicks()
	var readAt uint64 // the head the last successful read saw
	read := func() (final bool) {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
		st, _, err := c.cfg.Status.Authorization(rctx, key)
		cancel()
		if ctx.Err() != nil {
			return true // every viewer has left
		}
		if err == nil {
			readAt = st.Head
		}
		live := liveOf(st)
		ls.publish(l, live, err)
		return err == nil && live.Final
	}
	final, quiet := read(), 0
	for !final {
		select {
		case <-ctx.Done():
			return
		case <-headed:
			if !missed.Swap(false) && announced.Load() <= readAt {
				continue // already read at this head
			}
		case <-ticks:
			if quiet++; !pollDue(heads != nil && heads.Subscribed(), quiet, c.cfg.Poll) {
				continue
			}
		}
		final, quiet = read(), 0
	}
	<-ctx.Done() // a final answer is kept for viewers who join until the last one leaves
}

// pollDue says whether a reader reads on a Poll tick, quiet ticks after its last read. While the
// network's head subscription is up, heads bring the reads and a tick only guards against a
// subscription gone silent (once per keepAlive); without one, every tick reads.
func pollDue(subscribed bool, quiet int, poll time.Duration) bool {
	return !subscribed || time.Duration(quiet)*poll >= keepAlive
}
