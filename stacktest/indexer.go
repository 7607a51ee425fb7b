package stacktest

import (
	"context"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/indexer"
)

// Indexer is an indexer for the env's network (finality depth 2), running in the background.
type Indexer struct {
	ix    *indexer.Indexer
	once  sync.Once
	err   error
	quiet func()
}

// StartIndexer runs an indexer until the test ends (or Stop).
func (e *Env) StartIndexer(t testing.TB) *Indexer {
	t.Helper()
	log, quiet := QuietableLogger(t)
	return RunIndexer(t, indexer.Config{Network: e.Network().ID, Tokens: []common.Address{e.Chain.USDC.Address}, Chain: e.Chain.RPC,
		Store: e.DB, Finality: facilitator.Finality{Depth: 2}, PollInterval: 50 * time.Millisecond, Logger: log.With("component", "indexer")},
		quiet, nil)
}

// RunIndexer runs an indexer on cfg until the test ends (or Stop); quiet silences its logger once
// it has stopped. Stopping with an error fails the test, unless expected (if set) accepts it.
func RunIndexer(t testing.TB, cfg indexer.Config, quiet func(), expected func(error) bool) *Indexer {
	t.Helper()
	ix := indexer.New(cfg)
	if err := ix.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := &Indexer{ix: ix, quiet: quiet}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil && (expected == nil || !expected(err)) {
			t.Errorf("indexer stopped with %v", err)
		}
	})
	return r
}

// Service is the running indexer.
func (r *Indexer) Service() *indexer.Indexer { return r.ix }

// Stop stops the indexer and returns what its Stop returned.
func (r *Indexer) Stop() error {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r.err = r.ix.Stop(ctx)
		// The loop has returned, but its head follower may still be winding down: drop its last words.
		r.quiet()
	})
	return r.err
}

// WaitIndexed waits until the index's cursor is at block n or above and on the canonical chain.
func (e *Env) WaitIndexed(t testing.TB, n uint64) {
	t.Helper()
	limit := time.Now().Add(10 * time.Second)
	for {
		cur, ok, err := e.DB.Cursor(context.Background(), e.Network().ID)
		if err != nil {
			t.Fatal(err)
		}
		if ok && cur.Number >= n {
			if b, on := e.BlockIf(t, hexutil.EncodeUint64(cur.Number)); on && b.Hash == cur.Hash {
				return
			}
		}
		if time.Now().After(limit) {
			t.Fatalf("the index did not reach block %d within 10s: cursor %d %s", n, cur.Number, cur.Hash)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Use is the index's record of an authorization's use or cancellation (nil: none).
func (e *Env) Use(t testing.TB, k facilitator.AuthorizationKey) *facilitator.AuthorizationUse {
	t.Helper()
	u, err := e.DB.AuthorizationUse(context.Background(), k.Network, k.Asset, k.Payer, k.Nonce)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// LogID identifies an indexed log.
type LogID struct {
	Block     uint64
	BlockHash common.Hash
	Tx        common.Hash
	Index     uint
}

// IndexedLogs is everything the index holds for the network, sorted.
func (e *Env) IndexedLogs(t testing.TB) []LogID {
	t.Helper()
	return IndexedLogsOf(context.Background(), t, e.Pool, e.Network().ID, math.MaxInt64)
}

// IndexedLogsOf is what the index in db (a pool or a connection) holds for network in blocks
// 0..to, sorted.
func IndexedLogsOf(ctx context.Context, t testing.TB, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, network string, to uint64) []LogID {
	t.Helper()
	rows, err := db.Query(ctx, `
		SELECT block_number, block_hash, tx_hash, log_index FROM transfers WHERE network = $1 AND block_number <= $2
		UNION ALL
		SELECT block_number, block_hash, tx_hash, log_index FROM authorization_events WHERE network = $1 AND block_number <= $2`,
		network, int64(min(to, math.MaxInt64)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []LogID
	for rows.Next() {
		var n int64
		var bh, tx []byte
		var i int32
		if err := rows.Scan(&n, &bh, &tx, &i); err != nil {
			t.Fatal(err)
		}
		out = append(out, LogID{uint64(n), common.BytesToHash(bh), common.BytesToHash(tx), uint(i)})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sortLogs(out)
	return out
}

// ChainLogs is what eth_getLogs returns for USDC's three indexed events in blocks 0..to.
func (e *Env) ChainLogs(t testing.TB, to uint64) []LogID {
	t.Helper()
	return ChainLogsOf(t, e.Chain, to)
}

// ChainLogsOf is what eth_getLogs returns for chain's USDC's three indexed events in blocks
// 0..to, sorted.
func ChainLogsOf(t testing.TB, chain *devchain.Chain, to uint64) []LogID {
	t.Helper()
	var logs []types.Log
	filter := map[string]any{"fromBlock": "0x0", "toBlock": hexutil.EncodeUint64(to), "address": []common.Address{chain.USDC.Address},
		"topics": [][]common.Hash{{eip3009.TransferTopic, eip3009.AuthorizationUsedTopic, eip3009.AuthorizationCanceledTopic}}}
	if err := chain.RPC.CallContext(context.Background(), &logs, "eth_getLogs", filter); err != nil {
		t.Fatal(err)
	}
	out := make([]LogID, len(logs))
	for i, l := range logs {
		out[i] = LogID{l.BlockNumber, l.BlockHash, l.TxHash, l.Index}
	}
	sortLogs(out)
	return out
}

func sortLogs(l []LogID) {
	sort.Slice(l, func(i, j int) bool {
		if l[i].Block != l[j].Block {
			return l[i].Block < l[j].Block
		}
		return l[i].Index < l[j].Index
	})
}
