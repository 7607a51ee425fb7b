package ethrpc

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// resubscribeEvery is how often a dropped or refused head subscription is tried again.
const resubscribeEvery = 10 * time.Second

// Heads is one network's eth_subscribe("newHeads") subscription over its WebSocket URL, shared by
// everything that follows the network's heads (the settlement engine's watcher, the indexer), so
// a process opens one WebSocket per network whoever listens. It is subscribed while anyone
// follows, and a subscription that drops, is refused or cannot be dialed is tried again every
// resubscribeEvery. Heads only hurry their followers: each keeps polling on its own timer, so a
// subscription that drops or goes silent costs latency, never progress. With several URLs (several
// providers) one that cannot be dialed or refuses the subscription gives way to the next. Without a
// URL it never announces anything (an HTTP-only node) and followers just poll.
type Heads struct {
	urls    []string
	next    int // the URL the next subscription tries first (the subscription's goroutine's alone)
	timeout time.Duration
	log     *slog.Logger

	subscribed atomic.Bool

	// mu guards the followers and the subscription's goroutine; announcing holds it too, which
	// makes the subscription the only sender on each follower's channel.
	mu        sync.Mutex
	followers map[chan uint64]struct{}
	stop      context.CancelFunc // ends the running subscription; nil while nobody follows
	done      chan struct{}      // closed when the last subscription's goroutine has returned
}

// NewHeads returns the heads of the nodes at urls (ws:// or wss://; none, or only "", for none).
// timeout bounds the dial and the subscribe call (0: 10 s); log hears the subscription come and go
// (nil: nobody).
func NewHeads(timeout time.Duration, log *slog.Logger, urls ...string) *Heads {
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var kept []string
	for _, u := range urls {
		if u != "" {
			kept = append(kept, u)
		}
	}
	return &Heads{urls: kept, timeout: timeout, log: log, followers: map[chan uint64]struct{}{}}
}

// Subscribed reports whether the subscription is up now.
func (h *Heads) Subscribed() bool { return h.subscribed.Load() }

// Follow calls fn with each new head's number until ctx ends. fn runs on the caller's goroutine
// and the subscription never waits for it: while fn is busy, announcements coalesce into the
// highest one. fn(0) says the subscription has just (re)started, so heads may have been missed
// meanwhile: catch up. Follow returns once ctx has ended and, if it was the last follower, the
// subscription is closed.
func (h *Heads) Follow(ctx context.Context, fn func(head uint64)) {
	if len(h.urls) == 0 {
		<-ctx.Done()
		return
	}
	ch := make(chan uint64, 1)
	h.join(ctx, ch)
	defer h.leave(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case head := <-ch:
			fn(head)
		}
	}
}

// join adds a follower, subscribing if it is the first.
func (h *Heads) join(ctx context.Context, ch chan uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.followers[ch] = struct{}{}
	if h.stop != nil {
		return
	}
	// The subscription outlives the follower that started it: it ends with the last one.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	prev, done := h.done, make(chan struct{})
	h.stop, h.done = stop, done
	go func() {
		defer close(done)
		if prev != nil {
			<-prev // the previous subscription winds down first: one WebSocket at a time
		}
		h.run(runCtx)
	}()
}

// leave removes a follower; the last one ends the subscription and waits for it to close.
func (h *Heads) leave(ch chan uint64) {
	h.mu.Lock()
	delete(h.followers, ch)
	var done chan struct{}
	if len(h.followers) == 0 && h.stop != nil {
		h.stop()
		h.stop, done = nil, h.done
	}
	h.mu.Unlock()
	if done != nil {
		<-done
	}
}

// run keeps a subscription up until ctx ends.
func (h *Heads) run(ctx context.Context) {
	for {
		if h.subscribe(ctx) && ctx.Err() == nil {
			h.log.Warn("head subscription dropped; polling until it is back")
		}
		if !facilitator.Sleep(ctx, resubscribeEvery) {
			return
		}
	}
}

// subscribe follows newHeads on the first URL, from the last one that worked, that takes the
// subscription, until it fails or ctx ends; it reports whether it was subscribed at all.
func (h *Heads) subscribe(ctx context.Context) bool {
	for range h.urls {
		i := h.next
		if ok, up := h.subscribeAt(ctx, i); ok || ctx.Err() != nil {
			return up
		}
		h.next = (i + 1) % len(h.urls)
	}
	return false
}

// subscribeAt follows newHeads on URL i. ok is false when it could not subscribe there (try
// another); up reports whether it was subscribed. Logs name the URL by position, never by text
// (a provider's key is often in it).
func (h *Heads) subscribeAt(ctx context.Context, i int) (ok, up bool) {
	name := fmt.Sprintf("ws%d", i)
	dialCtx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	client, err := rpc.DialContext(dialCtx, h.urls[i])
	if err != nil {
		if ctx.Err() == nil {
			h.log.Debug("head subscription unavailable; polling", "endpoint", name, "err", redact(err))
		}
		return false, false
	}
	defer client.Close()
	heads := make(chan struct {
		Number hexutil.Uint64 `json:"number"`
	}, 16)
	// The context bounds the subscribe call only; the subscription outlives it.
	sub, err := client.EthSubscribe(dialCtx, heads, "newHeads")
	if err != nil {
		if ctx.Err() == nil {
			h.log.Debug("head subscription refused; polling", "endpoint", name, "err", redact(err))
		}
		return false, false
	}
	defer sub.Unsubscribe()
	h.subscribed.Store(true)
	defer h.subscribed.Store(false)
	h.log.Info("following heads over WebSocket", "endpoint", name)
	h.announce(0) // catch up on what arrived while we were not subscribed
	for {
		select {
		case <-ctx.Done():
			return true, true
		case err := <-sub.Err():
			h.log.Debug("head subscription ended", "endpoint", name, "err", redact(err))
			return true, true
		case head := <-heads:
			h.announce(uint64(head.Number))
		}
	}
}

// announce hands head to every follower without waiting: one that has not taken its last
// announcement gets the higher of the two instead.
func (h *Heads) announce(head uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.followers {
		next := head
		select {
		case old := <-ch:
			next = max(old, head)
		default:
		}
		ch <- next // cannot block: the buffer was just emptied, and only we send
	}
}
