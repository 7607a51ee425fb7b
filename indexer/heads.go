package indexer

import (
	"context"
	"time"
)

// Heads announces the network's new heads; *ethrpc.Heads, which the indexer shares with the
// settlement engine, is one.
type Heads interface {
	Follow(ctx context.Context, fn func(head uint64))
	Subscribed() bool
}

// followHeads signals new heads: on a PollInterval timer always, and at once on each head the
// network's subscription announces, when there is one. Polling never stops, so a subscription that
// goes silent (open but forwarding nothing), or a dial that hangs, costs latency, never progress.
// The channel holds one pending signal; the indexer reads the head itself, so coalescing loses
// nothing.
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
	if ix.cfg.Heads != nil {
		go ix.cfg.Heads.Follow(ctx, func(uint64) { signal() })
	}
	return out
}
