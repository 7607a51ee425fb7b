package indexer

import (
	"context"
	"time"

	"github.com/ethereum/go-ethereum/rpc"
)

// resubscribeEvery is how often a polling indexer tries to get its WebSocket subscription back.
const resubscribeEvery = 10 * time.Second

// followHeads signals new heads: on a PollInterval timer always, and at once on each head of an
// eth_subscribe("newHeads") subscription when a WebSocket URL is configured. Polling never stops,
// so a subscription that goes silent (open but forwarding nothing), or a dial that hangs, costs
// latency, never progress; a dropped subscription is retried every resubscribeEvery. The channel
// holds one pending signal; the indexer reads the head itself, so coalescing loses nothing.
func (ix *Indexer) followHeads(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	go func() {
		poll := time.NewTicker(ix.cfg.PollInterval)
		defer poll.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
				signal()
			}
		}
	}()
	if ix.cfg.WSURL != "" {
		go func() {
			for {
				if ix.subscribe(ctx, signal) && ctx.Err() == nil {
					ix.log.Warn("head subscription dropped; polling until it is back")
				}
				if !sleep(ctx, resubscribeEvery) {
					return
				}
			}
		}()
	}
	return out
}

// subscribe follows newHeads until the subscription fails or ctx ends; it reports whether it
// was subscribed at all.
func (ix *Indexer) subscribe(ctx context.Context, signal func()) bool {
	dialCtx, cancel := context.WithTimeout(ctx, ix.cfg.RPCTimeout)
	defer cancel()
	client, err := rpc.DialContext(dialCtx, ix.cfg.WSURL)
	if err != nil {
		ix.log.Debug("head subscription unavailable; polling", "err", err)
		return false
	}
	defer client.Close()
	heads := make(chan map[string]any, 16)
	// The context bounds the subscribe call only; the subscription outlives it.
	sub, err := client.EthSubscribe(dialCtx, heads, "newHeads")
	if err != nil {
		ix.log.Debug("head subscription refused; polling", "err", err)
		return false
	}
	defer sub.Unsubscribe()
	ix.subscribed.Store(true)
	defer ix.subscribed.Store(false)
	ix.log.Info("following heads over WebSocket")
	signal() // catch up on what arrived while we were not subscribed
	for {
		select {
		case <-ctx.Done():
			return true
		case err := <-sub.Err():
			ix.log.Debug("head subscription ended", "err", err)
			return true
		case <-heads:
			signal()
		}
	}
}
