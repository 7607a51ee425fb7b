package devchain

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// anvil 1.7.1 can strand a transaction: on a loaded machine, one that arrives while its
// predecessor from the same sender is still pending can stay "queued" after the predecessor is
// mined. Mining skips it, a resend is refused as already imported, and every later transaction of
// the sender waits behind it (a settle test saw its last payments never mined; the load command's
// ceiling, "1 of 20 mined"). The guard below watches the pool and, when a sender's next
// transaction has sat in "queued" on two looks in a row, empties the pool and sends every
// transaction in it again, the same bytes, each sender's in nonce order: anvil takes them afresh.

// guardEvery is how often the pool is looked at.
const guardEvery = 500 * time.Millisecond

// poolTx is a transaction as txpool_content lists it.
type poolTx struct {
	Hash common.Hash `json:"hash"`
}

// poolContent is txpool_content's answer: sender -> nonce (decimal) -> transaction.
type poolContent struct {
	Pending map[common.Address]map[string]poolTx `json:"pending"`
	Queued  map[common.Address]map[string]poolTx `json:"queued"`
}

// stranded are the senders whose transaction at their mined nonce (next[sender]) is queued:
// nothing comes before it, so it can only be queued by the fault.
func stranded(pool poolContent, next map[common.Address]uint64) map[common.Address]uint64 {
	out := map[common.Address]uint64{}
	for sender, txs := range pool.Queued {
		n, ok := next[sender]
		if !ok {
			continue
		}
		key := strconv.FormatUint(n, 10)
		if _, queued := txs[key]; !queued {
			continue
		}
		if _, pending := pool.Pending[sender][key]; pending {
			continue
		}
		out[sender] = n
	}
	return out
}

// guardPool runs until ctx ends.
func (c *Chain) guardPool(ctx context.Context) {
	t := time.NewTicker(guardEvery)
	defer t.Stop()
	var seen map[common.Address]uint64 // stranded on the last look
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := c.strandedNow(ctx)
		again := false
		for sender, n := range now {
			if m, ok := seen[sender]; ok && m == n {
				again = true
			}
		}
		seen = now
		if again {
			c.resendPool(ctx)
			seen = nil
		}
	}
}

// strandedNow looks at the pool once; a failed read is nothing stranded.
func (c *Chain) strandedNow(ctx context.Context) map[common.Address]uint64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var pool poolContent
	if err := c.RPC.CallContext(ctx, &pool, "txpool_content"); err != nil || len(pool.Queued) == 0 {
		return nil
	}
	next := map[common.Address]uint64{}
	for sender := range pool.Queued {
		var n hexutil.Uint64
		if err := ethrpc.One(ctx, c.RPC, ethrpc.TransactionCount(sender, "latest", &n)); err != nil {
			return nil
		}
		next[sender] = uint64(n)
	}
	return stranded(pool, next)
}

// resendPool empties the pool and sends its transactions again, each sender's in nonce order.
func (c *Chain) resendPool(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var pool poolContent
	if err := c.RPC.CallContext(ctx, &pool, "txpool_content"); err != nil {
		return
	}
	type entry struct {
		sender common.Address
		nonce  uint64
		raw    hexutil.Bytes
	}
	var all []entry
	for _, part := range []map[common.Address]map[string]poolTx{pool.Pending, pool.Queued} {
		for sender, txs := range part {
			for key, tx := range txs {
				n, err := strconv.ParseUint(key, 10, 64)
				if err != nil {
					continue
				}
				var raw hexutil.Bytes
				if err := c.RPC.CallContext(ctx, &raw, "eth_getRawTransactionByHash", tx.Hash); err != nil || len(raw) == 0 {
					c.log.Warn("devchain: a stranded pool could not be read whole; left as it is", "err", err)
					return
				}
				all = append(all, entry{sender, n, raw})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].sender != all[j].sender {
			return all[i].sender.Cmp(all[j].sender) < 0
		}
		return all[i].nonce < all[j].nonce
	})
	if err := c.RPC.CallContext(ctx, nil, "anvil_dropAllTransactions"); err != nil {
		return
	}
	for _, e := range all {
		var h common.Hash
		_ = ethrpc.One(ctx, c.RPC, ethrpc.SendRawTransaction(e.raw, &h)) // refused: mined meanwhile
	}
	c.log.Warn("devchain: anvil stranded a queued transaction; its pool was sent again", "transactions", len(all))
}

// decodePool is txpool_content's answer decoded (for tests).
func decodePool(raw []byte) (poolContent, error) {
	var p poolContent
	err := json.Unmarshal(raw, &p)
	return p, err
}
