package settle

import (
	"context"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
)

// resubscribeEvery is how often the watcher tries to get a dropped head subscription back.
const resubscribeEvery = 10 * time.Second

// followHeads wakes the watcher on every new head of an eth_subscribe("newHeads") subscription
// over the network's WebSocket URL, so receipts are read as soon as their block exists rather than
// at the next PollInterval tick. The ticker keeps running: a subscription that drops or goes
// silent costs latency, never progress. Without a WebSocket URL it does nothing.
func (n *network) followHeads(ctx context.Context) {
	if n.wsURL == "" {
		return
	}
	for {
		if n.subscribeHeads(ctx) && ctx.Err() == nil {
			n.engine.log.Warn("settle: head subscription dropped; polling receipts until it is back", "network", n.id.ID)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(resubscribeEvery):
		}
	}
}

// subscribeHeads follows newHeads until the subscription fails or ctx ends; it reports whether it
// was subscribed at all.
func (n *network) subscribeHeads(ctx context.Context) bool {
	e := n.engine
	dialCtx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	defer cancel()
	client, err := rpc.DialContext(dialCtx, n.wsURL)
	if err != nil {
		e.log.Debug("settle: head subscription unavailable; polling receipts", "network", n.id.ID, "err", err)
		return false
	}
	defer client.Close()
	heads := make(chan struct {
		Number hexutil.Uint64 `json:"number"`
	}, 16)
	// The context bounds the subscribe call only; the subscription outlives it.
	sub, err := client.EthSubscribe(dialCtx, heads, "newHeads")
	if err != nil {
		e.log.Debug("settle: head subscription refused; polling receipts", "network", n.id.ID, "err", err)
		return false
	}
	defer sub.Unsubscribe()
	n.wake() // catch up on what arrived while we were not subscribed
	for {
		select {
		case <-ctx.Done():
			return true
		case err := <-sub.Err():
			e.log.Debug("settle: head subscription ended", "network", n.id.ID, "err", err)
			return true
		case h := <-heads:
			n.sawHead(uint64(h.Number))
			n.wake()
		}
	}
}

// sawHead records the highest head number the subscription announced, so the watcher's next
// round need not ask the node for it.
func (n *network) sawHead(number uint64) { raise(&n.headHint, number) }
