package indexer_test

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"
)

// The three event signatures, spelled out here rather than taken from the indexer.
var (
	transferSig = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))
	usedSig     = crypto.Keccak256Hash([]byte("AuthorizationUsed(address,bytes32)"))
	canceledSig = crypto.Keccak256Hash([]byte("AuthorizationCanceled(address,bytes32)"))
)

// row is one indexed event, from either table, in a comparable form. blockTime is Unix seconds,
// or -1 for NULL.
type row struct {
	block     uint64
	blockHash common.Hash
	blockTime int64
	tx        common.Hash
	logIndex  uint
	token     common.Address
	// transfers
	from, to common.Address
	value    string
	// authorization_events
	kind       string
	authorizer common.Address
	nonce      common.Hash
}

func (r row) String() string {
	if r.kind == "" {
		return fmt.Sprintf("transfer{block %d %s t=%d tx %s #%d token %s %s->%s %s}", r.block, r.blockHash.TerminalString(), r.blockTime,
			r.tx.TerminalString(), r.logIndex, r.token, r.from, r.to, r.value)
	}
	return fmt.Sprintf("auth{block %d %s t=%d tx %s #%d token %s %s %s %s}", r.block, r.blockHash.TerminalString(), r.blockTime,
		r.tx.TerminalString(), r.logIndex, r.token, r.kind, r.authorizer, r.nonce.TerminalString())
}

// rawLog is a log as eth_getLogs returns it, decoded here without go-ethereum's types.Log.
type rawLog struct {
	Address        common.Address  `json:"address"`
	Topics         []common.Hash   `json:"topics"`
	Data           hexutil.Bytes   `json:"data"`
	BlockNumber    hexutil.Uint64  `json:"blockNumber"`
	BlockHash      common.Hash     `json:"blockHash"`
	BlockTimestamp *hexutil.Uint64 `json:"blockTimestamp"`
	TxHash         common.Hash     `json:"transactionHash"`
	LogIndex       hexutil.Uint    `json:"logIndex"`
	Removed        bool            `json:"removed"`
}

// fromChain reads every Transfer, AuthorizationUsed and AuthorizationCanceled log of tokens in
// blocks [from, to] with direct eth_getLogs calls and decodes them.
func fromChain(t testing.TB, tokens []common.Address, from, to uint64) (transfers, auths []row) {
	t.Helper()
	const chunk = 5000
	for lo := from; lo <= to; lo += chunk {
		hi := min(lo+chunk-1, to)
		var logs []rawLog
		filter := map[string]any{"fromBlock": hexutil.EncodeUint64(lo), "toBlock": hexutil.EncodeUint64(hi), "address": tokens,
			"topics": [][]common.Hash{{transferSig, usedSig, canceledSig}}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := chain.RPC.CallContext(ctx, &logs, "eth_getLogs", filter)
		cancel()
		if err != nil {
			t.Fatalf("eth_getLogs [%d, %d]: %v", lo, hi, err)
		}
		for _, l := range logs {
			if l.Removed {
				t.Fatalf("eth_getLogs returned a removed log: %+v", l)
			}
			r := row{block: uint64(l.BlockNumber), blockHash: l.BlockHash, blockTime: -1, tx: l.TxHash, logIndex: uint(l.LogIndex), token: l.Address}
			if l.BlockTimestamp != nil {
				r.blockTime = int64(*l.BlockTimestamp)
			}
			switch {
			case l.Topics[0] == transferSig && len(l.Topics) == 3 && len(l.Data) == 32:
				r.from, r.to = common.BytesToAddress(l.Topics[1][:]), common.BytesToAddress(l.Topics[2][:])
				r.value = new(big.Int).SetBytes(l.Data).String()
				transfers = append(transfers, r)
			case (l.Topics[0] == usedSig || l.Topics[0] == canceledSig) && len(l.Topics) == 3:
				r.kind = "used"
				if l.Topics[0] == canceledSig {
					r.kind = "canceled"
				}
				r.authorizer, r.nonce = common.BytesToAddress(l.Topics[1][:]), l.Topics[2]
				auths = append(auths, r)
			default:
				t.Fatalf("unexpected log shape from %s: %+v", l.Address, l)
			}
		}
	}
	return transfers, auths
}

// fromIndex reads the network's indexed events in blocks [from, to], in chain order.
func fromIndex(t testing.TB, network string, from, to uint64) (transfers, auths []row) {
	t.Helper()
	transfers = indexedRows(t, `SELECT block_number, block_hash, block_time, tx_hash, log_index, token, from_addr, to_addr, value::text
		FROM transfers WHERE network = $1 AND block_number BETWEEN $2 AND $3 ORDER BY block_number, log_index`, network, from, to,
		func(r *row) ([]any, func()) {
			var fromA, toA []byte
			return []any{&fromA, &toA, &r.value}, func() { r.from, r.to = addr20(t, fromA), addr20(t, toA) }
		})
	auths = indexedRows(t, `SELECT block_number, block_hash, block_time, tx_hash, log_index, token, kind, authorizer, nonce
		FROM authorization_events WHERE network = $1 AND block_number BETWEEN $2 AND $3 ORDER BY block_number, log_index`, network, from, to,
		func(r *row) ([]any, func()) {
			var authorizer, nonce []byte
			return []any{&r.kind, &authorizer, &nonce}, func() { r.authorizer, r.nonce = addr20(t, authorizer), hash32(t, nonce) }
		})
	return transfers, auths
}

// indexedRows runs query, over one events table, for network and blocks [from, to]. Its columns
// are the ones every event has (block number, hash and time, transaction, log index, token), then
// the table's own: own gives a row's destinations for those and what completes the row once they
// are scanned.
func indexedRows(t testing.TB, query, network string, from, to uint64, own func(r *row) ([]any, func())) []row {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, network, int64(from), int64(to))
	if err != nil {
		t.Fatal(err)
	}
	var out []row
	for rows.Next() {
		var r row
		var n int64
		var idx int32
		var bh, tx, token []byte
		var bt *time.Time
		dest, complete := own(&r)
		if err := rows.Scan(append([]any{&n, &bh, &bt, &tx, &idx, &token}, dest...)...); err != nil {
			t.Fatal(err)
		}
		r.block, r.blockHash, r.blockTime, r.tx, r.logIndex = uint64(n), hash32(t, bh), unix(bt), hash32(t, tx), uint(idx)
		r.token = addr20(t, token)
		complete()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func hash32(t testing.TB, b []byte) common.Hash {
	t.Helper()
	if len(b) != 32 {
		t.Fatalf("stored hash of %d bytes: %x", len(b), b)
	}
	return common.Hash(b)
}

func addr20(t testing.TB, b []byte) common.Address {
	t.Helper()
	if len(b) != 20 {
		t.Fatalf("stored address of %d bytes: %x", len(b), b)
	}
	return common.Address(b)
}

func unix(tm *time.Time) int64 {
	if tm == nil {
		return -1
	}
	return tm.Unix()
}

// counts of events compared.
type counts struct{ transfers, used, canceled int }

func (c counts) total() int { return c.transfers + c.used + c.canceled }

// compareWithChain checks that the network's index over [from, to] is exactly what eth_getLogs
// returns for tokens there: same number of rows, and every row equal field by field, in order.
func compareWithChain(t testing.TB, network string, tokens []common.Address, from, to uint64) counts {
	t.Helper()
	wantT, wantA := fromChain(t, tokens, from, to)
	gotT, gotA := fromIndex(t, network, from, to)
	compareRows(t, "transfers", wantT, gotT)
	compareRows(t, "authorization_events", wantA, gotA)
	c := counts{transfers: len(wantT)}
	for _, a := range wantA {
		if a.kind == "used" {
			c.used++
		} else {
			c.canceled++
		}
	}
	return c
}

func compareRows(t testing.TB, table string, want, got []row) {
	t.Helper()
	bad := 0
	for i := range max(len(want), len(got)) {
		var w, g row
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			bad++
			if bad <= 5 {
				t.Errorf("%s row %d:\n  chain: %v\n  index: %v", table, i, w, g)
			}
		}
	}
	if len(want) != len(got) || bad > 0 {
		t.Fatalf("%s: %d rows on chain, %d indexed, %d differ", table, len(want), len(got), bad)
	}
}

// checkWindow checks that every kept window block and the cursor are on the canonical chain.
func checkWindow(t testing.TB, network string) (cursor uint64, kept int) {
	t.Helper()
	ctx := context.Background()
	var n int64
	var h []byte
	if err := pool.QueryRow(ctx, `SELECT number, hash FROM index_cursors WHERE network = $1`, network).Scan(&n, &h); err != nil {
		t.Fatalf("reading the cursor: %v", err)
	}
	if want := blockHash(t, uint64(n)); common.BytesToHash(h) != want {
		t.Errorf("cursor %d has hash %x, the chain has %s", n, h, want)
	}
	rows, err := pool.Query(ctx, `SELECT number, hash, parent_hash FROM index_blocks WHERE network = $1 ORDER BY number`, network)
	if err != nil {
		t.Fatal(err)
	}
	type kb struct {
		n    int64
		h, p []byte
	}
	var blocks []kb
	for rows.Next() {
		var b kb
		if err := rows.Scan(&b.n, &b.h, &b.p); err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, b)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		hd := header(t, uint64(b.n))
		if common.BytesToHash(b.h) != hd.Hash || common.BytesToHash(b.p) != hd.ParentHash {
			t.Errorf("index_blocks %d: hash %x parent %x; the chain has %s parent %s", b.n, b.h, b.p, hd.Hash, hd.ParentHash)
		}
		if b.n > n {
			t.Errorf("index_blocks holds block %d above the cursor %d", b.n, n)
		}
	}
	return uint64(n), len(blocks)
}

type blockHeader struct {
	Number     hexutil.Uint64 `json:"number"`
	Hash       common.Hash    `json:"hash"`
	ParentHash common.Hash    `json:"parentHash"`
	Timestamp  hexutil.Uint64 `json:"timestamp"`
}

func header(t testing.TB, n uint64) blockHeader {
	t.Helper()
	var h *blockHeader
	if err := chain.RPC.CallContext(context.Background(), &h, "eth_getBlockByNumber", hexutil.EncodeUint64(n), false); err != nil {
		t.Fatal(err)
	}
	if h == nil {
		t.Fatalf("block %d does not exist", n)
	}
	return *h
}

func blockHash(t testing.TB, n uint64) common.Hash { return header(t, n).Hash }

// receiptOf returns a transaction's receipt, or nil when the canonical chain does not have it.
func receiptOf(t testing.TB, tx common.Hash) map[string]any {
	t.Helper()
	var r map[string]any
	if err := chain.RPC.CallContext(context.Background(), &r, "eth_getTransactionReceipt", tx); err != nil {
		t.Fatal(err)
	}
	return r
}

// indexedTx counts the rows a transaction has in the network's index (transfers, auth events).
func indexedTx(t testing.TB, network string, tx common.Hash) (transfers, auths int) {
	t.Helper()
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM transfers WHERE network = $1 AND tx_hash = $2`, network, tx[:]).Scan(&transfers); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM authorization_events WHERE network = $1 AND tx_hash = $2`, network, tx[:]).Scan(&auths); err != nil {
		t.Fatal(err)
	}
	return transfers, auths
}
