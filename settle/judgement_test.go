package settle

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/ledgercheck"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// TestOneJudgementOfAReceipt (issue 22, point 2): the same receipts, lone and batch, go through
// every reader of a receipt: the engine's watcher (summarize), the reconcile job's Judge and the
// ledger check. Each must say the same thing of the settlement's authorization: paid, paid
// something else, or not used by this transaction. Before, Judge read a batch's receipt as a lone
// settlement's, and another member's identical Transfer made a failed member "mined".
func TestOneJudgementOfAReceipt(t *testing.T) {
	token, payer, payTo := common.HexToAddress("0x7070"), common.HexToAddress("0xa1"), common.HexToAddress("0xb2")
	value := big.NewInt(250_000)
	key := facilitator.AuthorizationKey{Network: "eip155:31337", Asset: token, Payer: payer, Nonce: [32]byte{1}}
	other := key.Nonce
	other[0] = 2
	pair := func(nonce [32]byte, to common.Address, v int64) []ethrpc.Log {
		return []ethrpc.Log{logOf(eip3009.AuthorizationLog(token, payer, nonce, false)), logOf(eip3009.TransferLog(token, payer, to, big.NewInt(v)))}
	}
	const (
		paid      = "paid"
		paidOther = "paid other"
		notUsed   = "not used"
	)
	for _, tc := range []struct {
		name    string
		batched bool
		status  uint64
		logs    []ethrpc.Log
		want    string
	}{
		{"lone paid", false, 1, pair(key.Nonce, payTo, 250_000), paid},
		{"lone paid another amount", false, 1, pair(key.Nonce, payTo, 1), paidOther},
		{"lone paid another payee", false, 1, pair(key.Nonce, common.HexToAddress("0xc3"), 250_000), paidOther},
		{"lone reverted", false, 0, nil, notUsed},
		{"lone Transfer without the authorization's use", false, 1, pair(key.Nonce, payTo, 250_000)[1:], notUsed},
		{"batch member paid", true, 1, append(pair(other, payTo, 250_000), pair(key.Nonce, payTo, 250_000)...), paid},
		{"batch member reverted, another member identical", true, 1, pair(other, payTo, 250_000), notUsed},
		{"batch member paid another amount", true, 1, pair(key.Nonce, payTo, 7), paidOther},
		{"batch reverted", true, 0, nil, notUsed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := token
			if tc.batched {
				to = multicall3.Address
			}
			signerKey, _ := crypto.GenerateKey()
			signer := crypto.PubkeyToAddress(signerKey.PublicKey)
			tx := types.MustSignNewTx(signerKey, types.LatestSignerForChainID(big.NewInt(31337)),
				&types.DynamicFeeTx{ChainID: big.NewInt(31337), Nonce: 0, To: &to, Gas: 100_000, GasFeeCap: big.NewInt(1), GasTipCap: big.NewInt(1)})
			raw, _ := tx.MarshalBinary()
			block := uint64(100)
			rcpt := &ethrpc.Receipt{TxHash: tx.Hash(), Status: hexutil.Uint64(tc.status), BlockNumber: (*hexutil.Uint64)(&block),
				BlockHash: common.Hash{0xbb}, Logs: tc.logs}
			row := facilitator.OpenSettlement{Settlement: facilitator.Settlement{ID: 1, Key: key, PayTo: payTo, Value: value,
				ValidBefore: big.NewInt(time.Now().Add(time.Hour).Unix()), Signer: signer, TxNonce: 0, State: facilitator.StateBroadcast,
				TxHash: tx.Hash(), CreatedAt: time.Now().Add(-time.Hour)},
				Txs: []facilitator.TxRecord{{Hash: tx.Hash(), Raw: raw}}}

			// The engine's watcher.
			want, err := ExpectedOf(&row)
			if err != nil || want.Batched != tc.batched {
				t.Fatalf("ExpectedOf: batched %v %v, want %v", want.Batched, err, tc.batched)
			}
			s := summarize(rcpt, want)
			engine := notUsed
			switch {
			case s.success && s.transfer:
				engine = paid
			case s.success:
				engine = paidOther
			}
			if s.batchFailed != (tc.batched && tc.status == 1 && tc.want == notUsed) {
				t.Errorf("the watcher's batchFailed is %v", s.batchFailed)
			}

			// The reconcile job's.
			c := &receiptChain{head: block + 10, rcpt: rcpt, key: key, signer: signer}
			res, ok, err := Judge(context.Background(), c, func(c ethrpc.Chain) func(context.Context, []rpc.BatchElem) error {
				return c.BatchCallContext
			}, &row, facilitator.Finality{Depth: 1}, nil, nil, time.Now())
			if err != nil || !ok {
				t.Fatalf("Judge: %+v %v %v", res, ok, err)
			}
			judge := notUsed
			switch {
			case res.State == facilitator.StateMined && res.ErrorReason == "":
				judge = paid
			case res.State == facilitator.StateMined && res.ErrorReason == facilitator.ReasonTransferEventMismatch:
				judge = paidOther
			case res.State != facilitator.StateReverted:
				t.Fatalf("Judge answered %+v", res)
			}
			wantReason := facilitator.ReasonTransactionFailed
			if tc.batched && tc.status == 1 {
				wantReason = facilitator.ReasonBatchCallFailed
			}
			if judge == notUsed && res.ErrorReason != wantReason {
				t.Errorf("Judge's reason %q, want %q", res.ErrorReason, wantReason)
			}

			// The ledger check (the demo's table and the operations overview), of the row as mined.
			mined := row.Settlement
			mined.State, mined.BlockNumber, mined.BlockHash = facilitator.StateMined, block, rcpt.BlockHash
			v, problems := ledgercheck.Check(mined, ledgercheck.Evidence{Receipt: typesReceipt(rcpt), Used: c.used(), UsedKnown: true})
			check := notUsed
			switch {
			case v == ledgercheck.Agrees:
				check = paid
			case v == ledgercheck.Disagrees && c.used():
				check = paidOther
			}

			if engine != tc.want || judge != tc.want || check != tc.want {
				t.Fatalf("the watcher says %q, Judge %q (%+v), the ledger check %q (%v); want %q from all three",
					engine, judge, res, check, problems, tc.want)
			}
		})
	}
}

func logOf(l *types.Log) ethrpc.Log {
	return ethrpc.Log{Address: l.Address, Topics: l.Topics, Data: l.Data}
}

func typesReceipt(r *ethrpc.Receipt) *types.Receipt {
	out := &types.Receipt{TxHash: r.TxHash, Status: uint64(r.Status), BlockHash: r.BlockHash, BlockNumber: new(big.Int).SetUint64(uint64(*r.BlockNumber))}
	for _, l := range r.Logs {
		out.Logs = append(out.Logs, &types.Log{Address: l.Address, Topics: l.Topics, Data: l.Data})
	}
	return out
}

// receiptChain is a chain with one mined transaction, of the signer at its nonce 0, whose
// receipt is rcpt: its state and logs say the authorization was used when, and only when, the
// receipt carries the authorization's own pair.
type receiptChain struct {
	head   uint64
	rcpt   *ethrpc.Receipt
	key    facilitator.AuthorizationKey
	signer common.Address
}

func (c *receiptChain) used() bool {
	logs := typesReceipt(c.rcpt).Logs
	_, ok := eip3009.UsedBy(logs, c.key.Asset, c.key.Payer, c.key.Nonce)
	return c.rcpt.Status == 1 && ok
}

func (c *receiptChain) CallContext(ctx context.Context, result any, method string, args ...any) error {
	el := rpc.BatchElem{Method: method, Args: args, Result: result}
	if err := c.BatchCallContext(ctx, []rpc.BatchElem{el}); err != nil {
		return err
	}
	return el.Error
}

func (c *receiptChain) BatchCallContext(_ context.Context, elems []rpc.BatchElem) error {
	return answerBatch(elems, c.answer)
}

func (c *receiptChain) answer(el *rpc.BatchElem) (any, error) {
	switch el.Method {
	case "eth_blockNumber":
		return hexutil.Uint64(c.head), nil
	case "eth_getTransactionReceipt":
		if el.Args[0].(common.Hash) == c.rcpt.TxHash {
			return c.rcpt, nil
		}
		return nil, nil
	case "eth_getBlockByNumber":
		n, err := hexutil.DecodeUint64(el.Args[0].(string))
		if err != nil {
			return nil, err
		}
		return map[string]any{"hash": common.BigToHash(new(big.Int).SetUint64(n + 1000)), "number": hexutil.Uint64(n),
			"timestamp": hexutil.Uint64(time.Now().Unix())}, nil
	case "eth_getTransactionCount":
		return hexutil.Uint64(1), nil
	case "eth_call":
		state := make([]byte, 32)
		if c.used() {
			state[31] = 1
		}
		return hexutil.Bytes(state), nil
	case "eth_getLogs":
		logs := []map[string]any{}
		if c.used() {
			l := eip3009.AuthorizationLog(c.key.Asset, c.key.Payer, c.key.Nonce, false)
			logs = append(logs, map[string]any{"address": l.Address, "topics": l.Topics, "data": hexutil.Bytes(l.Data),
				"blockNumber": hexutil.Uint64(*c.rcpt.BlockNumber), "blockHash": c.rcpt.BlockHash, "transactionHash": c.rcpt.TxHash,
				"transactionIndex": "0x0", "logIndex": "0x0", "removed": false})
		}
		return logs, nil
	}
	return nil, fmt.Errorf("receiptChain: %s is not served", el.Method)
}
