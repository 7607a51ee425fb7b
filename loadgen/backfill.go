package loadgen

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"log/slog"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/indexer"
)

// Backfill is the indexer backfill phase: events emitted on the run's chain by
// devchain/testdata/Emitter.sol, then indexed into DB under a network id of the phase's own, so
// that nothing is written under the ids a facilitator uses.
type Backfill struct {
	DB     BackfillStore // migrated
	Key    *ecdsa.PrivateKey
	Events int // at least this many are emitted (whole emitMany calls)
}

// BackfillStore is the ledger the backfill phase indexes into: the indexer's store, and the
// network binding and the count of indexed events around it (the dev binary wires Postgres's).
type BackfillStore interface {
	indexer.Store
	BindNetwork(ctx context.Context, id string, chainID uint64, genesis common.Hash) error
	IndexedEvents(ctx context.Context, network string) (int64, error)
}

// Emitted is an Emitter contract and the events it emitted, all in final blocks.
type Emitted struct {
	Contract    common.Address
	DeployBlock uint64
	Head        uint64 // the head after the blocks mined to put the events below the window
	Calls       int    // emitMany transactions
	Events      int
}

// BackfillResult is one timed backfill of an Emitted chain.
type BackfillResult struct {
	Network string
	Emitted Emitted
	Stored  int64 // rows in Postgres afterwards; checked equal to Emitted.Events
	Elapsed time.Duration
}

// Rate is events stored per second.
func (r BackfillResult) Rate() float64 { return rate(int(r.Stored), r.Elapsed) }

// Blocks is how many blocks the indexer read: the deploy block to the head.
func (r BackfillResult) Blocks() uint64 { return r.Emitted.Head - r.Emitted.DeployBlock + 1 }

const (
	// eventsPerCall is what one emitMany(1000) emits: 1000 Transfer + 1000 AuthorizationUsed in
	// about 3.6M gas, well inside anvil's 30M block.
	eventsPerCall = 2000
	// backfillFinality is the indexer's finality depth here; its unfinalized window is then 128
	// blocks (the minimum), and finalMargin blocks mined after the events put them all below it,
	// so the indexer backfills them with eth_getLogs ranges rather than following them block by block.
	backfillFinality = 2
	finalMargin      = 200
)

// EmitEvents funds key (anvil_setBalance), deploys an Emitter from it and has it emit at least
// events events, ten transactions at a time, then mines finalMargin empty blocks.
func EmitEvents(ctx context.Context, rc *rpc.Client, timeout time.Duration, key *ecdsa.PrivateKey, events int) (Emitted, error) {
	n := &node{c: rc, timeout: timeout}
	compileCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	a, code, err := devchain.CompileEmitter(compileCtx)
	if err != nil {
		return Emitted{}, err
	}
	sender := crypto.PubkeyToAddress(key.PublicKey)
	eth := new(big.Int).Mul(big.NewInt(1_000_000), big.NewInt(1e18))
	if err := n.call(ctx, nil, "anvil_setBalance", sender, (*hexutil.Big)(eth)); err != nil {
		return Emitted{}, err
	}
	id, err := n.uint(ctx, "eth_chainId")
	if err != nil {
		return Emitted{}, err
	}
	nonce, err := n.nonceAt(ctx, sender, "pending")
	if err != nil {
		return Emitted{}, err
	}
	var latest struct {
		BaseFee hexutil.Big `json:"baseFeePerGas"`
	}
	if err := n.call(ctx, &latest, "eth_getBlockByNumber", "latest", false); err != nil {
		return Emitted{}, err
	}
	// Full blocks raise the base fee by up to 12.5% each: leave room for the whole run.
	tip := big.NewInt(1_000_000_000)
	feeCap := new(big.Int).Add(new(big.Int).Mul(latest.BaseFee.ToInt(), big.NewInt(20)), big.NewInt(100_000_000_000))
	signer := ethrpc.NewSigner(id, key)
	sign := func(to *common.Address, data []byte, gas uint64) (*types.Transaction, error) {
		tx, err := signer.Sign(nonce, to, data, gas, tip, feeCap)
		nonce++
		return tx, err
	}

	deploy, err := sign(nil, code, 1_000_000)
	if err != nil {
		return Emitted{}, err
	}
	rcpts, err := sendMined(ctx, n, []*types.Transaction{deploy}, 1)
	if err != nil {
		return Emitted{}, fmt.Errorf("deploying the Emitter: %w", err)
	}
	e := Emitted{Contract: *rcpts[0].ContractAddress, DeployBlock: uint64(rcpts[0].BlockNumber)}

	e.Calls = (events + eventsPerCall - 1) / eventsPerCall
	perCall := (events + 2*e.Calls - 1) / (2 * e.Calls)
	data, err := a.Pack("emitMany", big.NewInt(int64(perCall)))
	if err != nil {
		return e, err
	}
	txs := make([]*types.Transaction, e.Calls)
	for i := range txs {
		if txs[i], err = sign(&e.Contract, data, 10_000_000); err != nil {
			return e, err
		}
	}
	if rcpts, err = sendMined(ctx, n, txs, 10); err != nil {
		return e, fmt.Errorf("emitMany: %w", err)
	}
	for _, r := range rcpts {
		e.Events += len(r.Logs)
	}
	if want := 2 * perCall * e.Calls; e.Events != want {
		return e, fmt.Errorf("the Emitter emitted %d events, want %d", e.Events, want)
	}
	if err := n.call(ctx, nil, "anvil_mine", hexutil.Uint64(finalMargin)); err != nil {
		return e, err
	}
	e.Head, err = n.head(ctx)
	return e, err
}

// minedReceipt is the part of a receipt EmitEvents reads.
type minedReceipt struct {
	Status          hexutil.Uint64  `json:"status"`
	BlockNumber     hexutil.Uint64  `json:"blockNumber"`
	ContractAddress *common.Address `json:"contractAddress"`
	Logs            []struct{}      `json:"logs"`
}

// sendMined sends raws batch at a time and waits for each batch's receipts before the next, so
// anvil never holds more than a batch unconfirmed; a reverted transaction is an error. In
// auto-mine, transactions that missed the last block wait for the next arrival, so a block is
// mined when some are missing and the chain has not moved for a while.
func sendMined(ctx context.Context, n *node, txs []*types.Transaction, batch int) ([]minedReceipt, error) {
	var out []minedReceipt
	for lo := 0; lo < len(txs); lo += batch {
		part := txs[lo:min(lo+batch, len(txs))]
		raws, hashes := make([]string, len(part)), make([]common.Hash, len(part))
		for i, tx := range part {
			b, err := tx.MarshalBinary()
			if err != nil {
				return nil, err
			}
			raws[i], hashes[i] = hexutil.Encode(b), tx.Hash()
		}
		if err := sendRaw(ctx, n, raws); err != nil {
			return nil, err
		}
		rcpts, err := waitReceipts(ctx, n, hashes)
		if err != nil {
			return nil, err
		}
		out = append(out, rcpts...)
	}
	return out, nil
}

func waitReceipts(ctx context.Context, n *node, hashes []common.Hash) ([]minedReceipt, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	got := make([]*minedReceipt, len(hashes))
	lastHead, movedAt := uint64(0), time.Now()
	for {
		var elems []rpc.BatchElem
		for i, r := range got {
			if r == nil {
				elems = append(elems, rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{hashes[i]}, Result: &got[i]})
			}
		}
		if len(elems) == 0 {
			break
		}
		if err := n.batch(ctx, elems); err != nil {
			return nil, fmt.Errorf("eth_getTransactionReceipt: %w", err)
		}
		for _, e := range elems {
			if e.Error != nil {
				return nil, fmt.Errorf("eth_getTransactionReceipt: %w", e.Error)
			}
		}
		h, err := n.head(ctx)
		if err != nil {
			return nil, err
		}
		if h != lastHead {
			lastHead, movedAt = h, time.Now()
		} else if time.Since(movedAt) > 250*time.Millisecond {
			if err := n.call(ctx, nil, "evm_mine"); err != nil {
				return nil, err
			}
			movedAt = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d receipts: %w", len(hashes), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	out := make([]minedReceipt, len(got))
	for i, r := range got {
		if r.Status != 1 {
			return nil, fmt.Errorf("transaction %s reverted in block %d", hashes[i], r.BlockNumber)
		}
		out[i] = *r
	}
	return out, nil
}

// TimeBackfill binds network (a fresh id) to the chain in db, runs an indexer for e.Contract from
// e.DeployBlock, times it until its cursor reaches e.Head, stops it, and checks that the rows
// stored under network are the events emitted.
func TimeBackfill(ctx context.Context, rc *rpc.Client, timeout time.Duration, db BackfillStore, network string, e Emitted, log *slog.Logger) (BackfillResult, error) {
	r := BackfillResult{Network: network, Emitted: e}
	n := &node{c: rc, timeout: timeout}
	id, err := n.uint(ctx, "eth_chainId")
	if err != nil {
		return r, err
	}
	var genesis struct {
		Hash common.Hash `json:"hash"`
	}
	if err := n.call(ctx, &genesis, "eth_getBlockByNumber", "0x0", false); err != nil {
		return r, err
	}
	if err := db.BindNetwork(ctx, network, id, genesis.Hash); err != nil {
		return r, err
	}
	ix := indexer.New(indexer.Config{Network: network, Tokens: []common.Address{e.Contract}, Chain: rc, Store: db,
		StartBlock: e.DeployBlock, Finality: facilitator.Finality{Depth: backfillFinality}, PollInterval: 50 * time.Millisecond,
		RPCTimeout: timeout, Logger: log})
	begin := time.Now()
	if err := ix.Start(ctx); err != nil {
		return r, err
	}
	stop := func() error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return ix.Stop(stopCtx)
	}
	defer func() { _ = stop() }() // for the early returns; the stop that counts is checked below
	// A bound far above any expected backfill (seconds for 100,000 events), so that a stuck
	// indexer ends the run with its status instead of hanging it.
	deadline := time.After(10 * time.Minute)
	var st indexer.Health
	for st = ix.Health(); st.Cursor < e.Head; st = ix.Health() {
		select {
		case <-ix.Done():
			return r, fmt.Errorf("the indexer stopped before the head (%v); status %+v", ix.Err(), st)
		case <-ctx.Done():
			return r, ctx.Err()
		case <-deadline:
			return r, fmt.Errorf("the indexer did not reach block %d in 10 minutes; status %+v", e.Head, st)
		case <-time.After(5 * time.Millisecond):
		}
	}
	r.Elapsed = time.Since(begin)
	if err := stop(); err != nil {
		return r, fmt.Errorf("indexer: %w", err)
	}
	if r.Stored, err = db.IndexedEvents(ctx, network); err != nil {
		return r, err
	}
	if r.Stored != int64(e.Events) || st.Events != int64(e.Events) {
		return r, fmt.Errorf("stored %d rows, the indexer reports %d events; the chain has %d", r.Stored, st.Events, e.Events)
	}
	return r, nil
}
