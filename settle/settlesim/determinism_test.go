package settlesim

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// scenario drives every component from one seed with the engine's kinds of calls (fee reads,
// batched sends and receipt polls, block receipts, logs, ledger writes) and the third parties'
// actions, and returns the trace of every call and answer.
func scenario(t *testing.T, seed uint64, steps, keep int) *Trace {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	trace := NewTrace(keep)
	clock := NewClock(start)
	chain := NewChain(ChainConfig{SafeDepth: 2, FinalizedDepth: 4}, clock)
	chain.SetTrace(trace)
	var backends []*Backend
	for i := range 3 {
		b := NewBackend(chain, fmt.Sprintf("node%d", i), RandomProfile(r), r)
		b.SetTrace(trace)
		backends = append(backends, b)
	}
	lb := NewBalancer(r, backends...)
	ledger := NewLedger(clock, LedgerFaults{Fail: 0.1, Ambiguous: 0.1, Slow: 0.1, SlowBy: time.Second}, r)
	ledger.SetTrace(trace)

	signer := key(t, "signer")
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	payer := common.HexToAddress("0x00000000000000000000000000000000000000bb")
	chain.Fund(addr, new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18)))
	chain.Mint(payer, big.NewInt(1_000_000_000))
	token := chain.Token()
	signerOf := types.LatestSignerForChainID(big.NewInt(1337))

	type sent struct {
		id   int64
		tx   *types.Transaction
		data []byte
		auth facilitator.Authorization
	}
	var (
		all   []sent
		nonce uint64
	)
	for step := range steps {
		trace.Record("step %d", step)
		switch r.IntN(12) {
		case 0, 1, 2: // a settlement: fees, sign, commit, broadcast
			var head struct {
				BaseFee *hexutil.Big `json:"baseFeePerGas"`
			}
			var tip hexutil.Big
			batch := []rpc.BatchElem{
				{Method: "eth_getBlockByNumber", Args: []any{"latest", false}, Result: &head},
				{Method: "eth_maxPriorityFeePerGas", Result: &tip},
			}
			if err := lb.BatchCallContext(ctx, batch); err != nil || batch[0].Error != nil || head.BaseFee == nil {
				continue
			}
			fees := settle.SuggestFees(head.BaseFee.ToInt(), tip.ToInt(), big.NewInt(1))
			a := facilitator.Authorization{From: payer, To: common.BigToAddress(big.NewInt(int64(1000 + r.IntN(5)))),
				Value: big.NewInt(int64(1 + r.IntN(100))), ValidAfter: big.NewInt(0),
				ValidBefore: big.NewInt(clock.Now().Unix() + int64(30+r.IntN(600))), Nonce: [32]byte{byte(step), byte(step >> 8), 1}}
			data := calldata(a)
			tx, err := types.SignNewTx(signer, signerOf, &types.DynamicFeeTx{ChainID: big.NewInt(1337), Nonce: nonce,
				GasTipCap: fees.TipCap, GasFeeCap: fees.FeeCap, Gas: eip3009.GasLimit(96_000), To: &token, Data: data})
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := tx.MarshalBinary()
			id, err := ledger.InsertSettlement(ctx, &facilitator.NewSettlement{
				Key:   facilitator.AuthorizationKey{Network: network, Asset: token, Payer: payer, Nonce: a.Nonce},
				Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Request: []byte("{}"), Signer: addr, TxNonce: nonce,
				Tx: facilitator.TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: tx.Gas()}})
			if err != nil {
				if s, rerr := ledger.SettlementByKey(ctx, facilitator.AuthorizationKey{Network: network, Asset: token, Payer: payer, Nonce: a.Nonce}); rerr != nil || s.TxHash != tx.Hash() {
					continue // nothing committed: nothing goes out
				} else {
					id = s.ID
				}
			}
			nonce++
			all = append(all, sent{id, tx, data, a})
			elems := []rpc.BatchElem{{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes(raw)}, Result: new(common.Hash)}}
			if err := lb.BatchCallContext(ctx, elems); err == nil && elems[0].Error == nil {
				_ = ledger.MarkBroadcast(ctx, []int64{id})
			}
		case 3: // a watcher round: receipts of everything, outcomes to the ledger
			if len(all) == 0 {
				continue
			}
			slots := make([]*types.Receipt, len(all))
			elems := make([]rpc.BatchElem, len(all))
			for i, s := range all {
				elems[i] = rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{s.tx.Hash()}, Result: &slots[i]}
			}
			if err := lb.BatchCallContext(ctx, elems); err != nil {
				continue
			}
			var rs []facilitator.Resolution
			for i, rc := range slots {
				if elems[i].Error != nil || rc == nil {
					continue
				}
				st := facilitator.StateMined
				if rc.Status == 0 {
					st = facilitator.StateReverted
				}
				rs = append(rs, facilitator.Resolution{ID: all[i].id, State: st, TxHash: rc.TxHash, BlockNumber: rc.BlockNumber.Uint64(), BlockHash: rc.BlockHash})
			}
			if len(rs) > 0 {
				moved, _, err := ledger.Resolve(ctx, rs)
				trace.Record("resolved %v %v", moved, err)
			}
		case 4, 5:
			chain.Mine()
		case 6:
			clock.Advance(time.Duration(1+r.IntN(12)) * time.Second)
		case 7:
			policy := ReorgPolicy(r.IntN(5))
			_, _ = chain.Reorg(1+r.IntN(2), policy)
		case 8: // third parties
			switch k := r.IntN(4); {
			case k == 0 && len(all) > 0:
				_, _ = chain.ThirdPartyTransfer(all[r.IntN(len(all))].data)
			case k == 1 && len(all) > 0:
				s := all[r.IntN(len(all))]
				_, _ = chain.Cancel(s.auth.From, s.auth.Nonce)
			case k == 2:
				n := chain.Nonce(addr)
				_, _ = chain.SubmitForeign(ForeignTx{Key: signer, Nonce: &n, Force: r.IntN(2) == 0})
			default:
				if p := chain.Pool(); len(p) > 0 {
					chain.DropFromPool(p[r.IntN(len(p))])
				}
			}
		case 9: // reads the indexer, reconcile and foreign.go make
			var logs []types.Log
			_ = lb.CallContext(ctx, &logs, "eth_getLogs", map[string]any{"fromBlock": "0x0", "toBlock": "latest", "address": []common.Address{token},
				"topics": [][]common.Hash{{eip3009.TransferTopic, eip3009.AuthorizationUsedTopic, eip3009.AuthorizationCanceledTopic}}})
			var count hexutil.Uint64
			_ = lb.CallContext(ctx, &count, "eth_getTransactionCount", addr, "latest")
			var rcpts []*types.Receipt
			_ = lb.CallContext(ctx, &rcpts, "eth_getBlockReceipts", "latest")
			var final struct {
				Hash common.Hash `json:"hash"`
			}
			_ = lb.CallContext(ctx, &final, "eth_getBlockByNumber", "finalized", false)
		case 10:
			open, err := ledger.OpenSettlements(ctx, network, addr)
			trace.Record("open %d %v", len(open), err)
			var finals []facilitator.MinedIn
			for _, o := range open {
				if o.State == facilitator.StateMined {
					finals = append(finals, facilitator.MinedIn{ID: o.ID, BlockHash: o.BlockHash})
				}
			}
			moved, err := ledger.MarkFinal(ctx, finals)
			trace.Record("final %v %v", moved, err)
		case 11: // a rebroadcast of an earlier transaction, or a fee bump of the newest
			if len(all) == 0 {
				continue
			}
			if r.IntN(2) == 0 {
				raw, _ := all[r.IntN(len(all))].tx.MarshalBinary()
				var h common.Hash
				_ = lb.CallContext(ctx, &h, "eth_sendRawTransaction", hexutil.Bytes(raw))
				continue
			}
			s := all[len(all)-1]
			bumped, _ := settle.BumpFees(settle.Fees{TipCap: s.tx.GasTipCap(), FeeCap: s.tx.GasFeeCap()}, settle.Fees{TipCap: big.NewInt(1), FeeCap: big.NewInt(1)}, facilitator.MinBumpPercent, nil)
			tx, _ := types.SignNewTx(signer, signerOf, &types.DynamicFeeTx{ChainID: big.NewInt(1337), Nonce: s.tx.Nonce(),
				GasTipCap: bumped.TipCap, GasFeeCap: bumped.FeeCap, Gas: s.tx.Gas(), To: &token, Data: s.data})
			raw, _ := tx.MarshalBinary()
			if err := ledger.AddTx(ctx, s.id, facilitator.TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: bumped.TipCap, FeeCap: bumped.FeeCap, Gas: tx.Gas()}); err == nil {
				var h common.Hash
				_ = lb.CallContext(ctx, &h, "eth_sendRawTransaction", hexutil.Bytes(raw))
				all[len(all)-1] = sent{s.id, tx, s.data, s.auth}
			}
		}
	}
	// The end state, as the oracle reads it.
	ledger.SetFaults(LedgerFaults{})
	head := chain.Head()
	trace.Record("head %d %s", head.Number, head.Hash.Hex())
	for _, b := range chain.Balances() {
		trace.Record("balance %s %s %s %d", b.Address.Hex(), b.Wei, b.Tokens, b.Nonce)
	}
	for _, info := range chain.Txs() {
		trace.Record("tx %s %s %d %v %v %d %s", info.Hash.Hex(), info.Source, info.Nonce, info.Pooled, info.Mined, info.Status, info.Fate)
	}
	for _, row := range ledger.Rows() {
		trace.Record("row %d %s %s %d", row.Settlement.ID, row.Settlement.State, row.Settlement.TxHash.Hex(), len(row.Events))
	}
	return trace
}

// TestDeterminism: the same seed gives the same trace, call for call, however often it runs
// (map iteration order changes from run to run, so anything that depended on it would show);
// another seed gives another.
func TestDeterminism(t *testing.T) {
	steps := 400
	if testing.Short() {
		steps = 100
	}
	for _, seed := range []uint64{1, 2, 3} {
		first := scenario(t, seed, steps, 50)
		for range 2 {
			again := scenario(t, seed, steps, 50)
			if first.Sum() != again.Sum() || first.Len() != again.Len() {
				t.Fatalf("seed %d: traces differ (%d and %d lines); last lines:\n%v\n%v", seed, first.Len(), again.Len(), first.Lines(), again.Lines())
			}
		}
		if first.Len() < steps*2 {
			t.Fatalf("seed %d: only %d lines traced", seed, first.Len())
		}
	}
	if scenario(t, 1, steps, 0).Sum() == scenario(t, 2, steps, 0).Sum() {
		t.Fatal("two seeds gave the same trace")
	}
}

// TestScenarioExercisesEverything: the scenario reaches reorganisations, reverts, foreign
// transactions and every kind of fault, so that TestDeterminism covers them.
func TestScenarioExercisesEverything(t *testing.T) {
	want := []string{
		"chain reorg depth", "chain foreign", "chain third-party transfer", "chain cancel", `"status":"0x0"`, `"status":"0x1"`,
		"nonce too low", "request error", "limit exceeded", ErrLedgerDown.Error(), ErrLedgerAmbiguous.Error(), "resolved [",
	}
	found := map[string]bool{}
	for _, seed := range []uint64{1, 2, 3} {
		for _, line := range scenario(t, seed, 400, 1<<20).Lines() {
			for _, w := range want {
				if strings.Contains(line, w) {
					found[w] = true
				}
			}
		}
	}
	for _, w := range want {
		if !found[w] {
			t.Errorf("no seed's trace has %q", w)
		}
	}
}
