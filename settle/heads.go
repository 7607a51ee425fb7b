package settle

import "context"

// Heads announces a network's new heads; *ethrpc.Heads, which the engine shares with the
// indexer, is one. fn(0) says the announcements restarted and some may have been missed.
type Heads interface {
	Follow(ctx context.Context, fn func(head uint64))
	// Subscribed reports whether the subscription is up now: while it is, a head it has not
	// announced is a head not mined yet (as far as any read could tell a moment later).
	Subscribed() bool
}

// followHeads wakes the watcher on every new head the network's subscription announces, so
// receipts are read as soon as their block exists rather than at the next PollInterval tick. The
// ticker keeps running: a subscription that drops or goes silent costs latency, never progress.
// Without Heads it does nothing.
func (n *chainEngine) followHeads(ctx context.Context) {
	if n.heads == nil {
		return
	}
	n.heads.Follow(ctx, func(head uint64) {
		n.sawHead(head) // 0, a new subscription, raises nothing: the wake catches up
		n.wake()
	})
}

// sawHead records the highest head number the subscription announced, so the watcher's next
// round need not ask the node for it.
func (n *chainEngine) sawHead(number uint64) { raise(&n.headHint, number) }

// subscribed reports whether the network's heads subscription is up.
func (n *chainEngine) subscribed() bool { return n.heads != nil && n.heads.Subscribed() }
