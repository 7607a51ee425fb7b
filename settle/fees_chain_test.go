package settle_test

import (
	"context"
	"errors"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

func gweiN(n int64) *big.Int { return new(big.Int).Mul(big.NewInt(n), big.NewInt(1e9)) }

// withFees sets the fee policy of the engine's network.
func withFees(p facilitator.FeePolicy, edit func(*settle.Config)) func(*settle.Config) {
	return func(c *settle.Config) {
		c.Networks[0].Fees = p
		if edit != nil {
			edit(c)
		}
	}
}

// mineTips mines one block holding a transfer per tip (from one fresh key, each the same gas), so
// that the block's reward percentiles are known.
func mineTips(t *testing.T, tips ...int64) {
	t.Helper()
	ctx := context.Background()
	key := env.NewSigner(t)
	s := ethrpc.NewSigner(env.Chain.ChainID, key)
	to := stacktest.NewAddress(t)
	for i, tip := range tips {
		tx, err := s.Sign(uint64(i), &to, nil, 21_000, gweiN(tip), gweiN(1000))
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Chain.Client.SendTransaction(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	env.Mine(t)
}

// nextBaseFee is the next block's base fee, read from the node.
func nextBaseFee(t *testing.T) *big.Int {
	t.Helper()
	// anvil fills its fee history after it mines a block, so on a loaded machine the answer just
	// after mining can lack the latest block (one base fee, not two): asked again, briefly.
	for try := 0; ; try++ {
		var h struct {
			BaseFees []*hexutil.Big `json:"baseFeePerGas"`
		}
		err := env.Chain.RPC.CallContext(context.Background(), &h, "eth_feeHistory", hexutil.Uint64(1), "latest", []float64{})
		if err == nil && len(h.BaseFees) == 2 {
			return h.BaseFees[1].ToInt()
		}
		if try == 50 {
			t.Fatalf("eth_feeHistory: %v %v", h.BaseFees, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settleOnce settles body with mining off (so the fees the engine read are the chain's now),
// then mines it; it answers the transaction the ledger first committed and the one mined, and
// checks the payee was paid exactly value.
func settleOnce(t *testing.T, r *stacktest.Engine, p stacktest.Pay, value int64) (first, mined *types.Transaction) {
	t.Helper()
	ctx := context.Background()
	body := p.Body(t)
	out := r.MustSettle(t, body)
	if out.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("with mining off, want settlement_pending: %+v", out.Response)
	}
	open, err := r.DB.OpenSettlements(ctx, env.Network().ID, stacktest.AddressOf(r.Signers[0]))
	if err != nil || len(open) != 1 {
		t.Fatalf("open settlements %v, %v", open, err)
	}
	first = decodeTx(t, open[0].Txs[0].Raw)
	tx, _, err := env.Chain.Client.TransactionByHash(ctx, mineUntilSettled(t, r, body))
	if err != nil {
		t.Fatal(err)
	}
	if got := env.Balance(t, p.PayTo); got != value {
		t.Fatalf("payee holds %d, want exactly %d", got, value)
	}
	if n := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "latest"); n != 1 {
		t.Fatalf("signer nonce %d: one transaction", n)
	}
	return first, tx
}

// mineUntilSettled turns mining back on and resends body until it answers success; it answers the
// transaction named.
func mineUntilSettled(t *testing.T, r *stacktest.Engine, body []byte) common.Hash {
	t.Helper()
	env.SetAutomine(t, true)
	env.Mine(t)
	out := settledPastPending(t, r, body, "after mining")
	if !out.Response.Success {
		t.Fatalf("after mining: %+v", out.Response)
	}
	return common.HexToHash(out.Response.Transaction)
}

// TestSettleFeesFromHistory: the settlement's transaction carries the tip at the policy's
// percentile of the last block's rewards (anvil's eth_feeHistory), and a fee cap of the policy's
// multiple of the next base fee plus that tip.
func TestSettleFeesFromHistory(t *testing.T) {
	payer := env.FundedPayer(t, 1_000) // before mining stops: minting waits for its receipt
	env.ManualMining(t)
	// Five transfers of equal gas tipping 1..5 gwei: the 75th percentile is the fourth, 4 gwei
	// (neither their median nor anvil's own suggestion).
	mineTips(t, 3, 1, 5, 2, 4)
	next := nextBaseFee(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: 500 * time.Millisecond,
		Config: withFees(facilitator.FeePolicy{TipPercentile: 75, HistoryBlocks: 1, FeeCapPercent: 300}, nil)})
	p := env.NewPay(t, payer, 1_000)
	first, mined := settleOnce(t, r, p, 1_000)

	wantTip := gweiN(4)
	wantCap := new(big.Int).Add(new(big.Int).Mul(next, big.NewInt(3)), wantTip)
	for _, tx := range []*types.Transaction{first, mined} {
		if tx.Type() != types.DynamicFeeTxType || tx.GasTipCap().Cmp(wantTip) != 0 || tx.GasFeeCap().Cmp(wantCap) != 0 {
			t.Fatalf("tx type %d tip %s cap %s, want type 2 tip %s cap %s (next base fee %s)", tx.Type(), tx.GasTipCap(), tx.GasFeeCap(), wantTip, wantCap, next)
		}
	}
}

// noFeeHistory is a node without eth_feeHistory (its batches answer the method as not found).
type noFeeHistory struct{ ethrpc.Chain }

type methodNotFound struct{}

func (methodNotFound) Error() string {
	return "the method eth_feeHistory does not exist/is not available"
}
func (methodNotFound) ErrorCode() int { return -32601 }

func (c noFeeHistory) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	var fwd []rpc.BatchElem
	var idx []int
	for i := range b {
		if b[i].Method == "eth_feeHistory" {
			b[i].Error = methodNotFound{}
			continue
		}
		fwd, idx = append(fwd, b[i]), append(idx, i)
	}
	if len(fwd) == 0 {
		return nil
	}
	err := c.Chain.BatchCallContext(ctx, fwd)
	for j, i := range idx {
		b[i].Error = fwd[j].Error
	}
	return err
}

func (c noFeeHistory) CallContext(ctx context.Context, result any, method string, args ...any) error {
	if method == "eth_feeHistory" {
		return methodNotFound{}
	}
	return c.Chain.CallContext(ctx, result, method, args...)
}

// TestSettleFeesWithoutFeeHistory: a node without eth_feeHistory is priced from the latest
// block's base fee and its eth_maxPriorityFeePerGas, and the payment settles once.
func TestSettleFeesWithoutFeeHistory(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000)
	env.ManualMining(t)
	mineTips(t, 1, 1, 1, 1, 9) // a history tip (9 gwei at the 100th percentile) the fallback must not use
	var head struct {
		BaseFee *hexutil.Big `json:"baseFeePerGas"`
	}
	var tip hexutil.Big
	if err := env.Chain.RPC.CallContext(ctx, &head, "eth_getBlockByNumber", "latest", false); err != nil {
		t.Fatal(err)
	}
	if err := env.Chain.RPC.CallContext(ctx, &tip, "eth_maxPriorityFeePerGas"); err != nil {
		t.Fatal(err)
	}
	// The policy takes the block's top reward, 9 gwei; the node suggests less.
	if tip.ToInt().Cmp(gweiN(9)) == 0 {
		t.Fatal("the node suggests the history's tip: the test cannot tell the paths apart")
	}
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: 500 * time.Millisecond, Chain: noFeeHistory{env.Chain.RPC},
		Config: withFees(facilitator.FeePolicy{HistoryBlocks: 1, TipPercentile: 100}, nil)})
	p := env.NewPay(t, payer, 1_000)
	first, _ := settleOnce(t, r, p, 1_000)
	wantCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee.ToInt(), big.NewInt(2)), tip.ToInt())
	if first.GasTipCap().Cmp(tip.ToInt()) != 0 || first.GasFeeCap().Cmp(wantCap) != 0 {
		t.Fatalf("tip %s cap %s, want the node's tip %s and cap %s", first.GasTipCap(), first.GasFeeCap(), tip.ToInt(), wantCap)
	}
}

// TestSettleFeesAboveMaxFee: when the next base fee and the tip are above the network's max fee,
// /settle is refused with network_fees_above_cap and a Retry-After: nothing signed, nothing in the
// ledger, nothing sent. The warning gives the fees in gwei, named so, and the engine reports the
// fee cap the chain needs beside the max fee (the metrics' reading).
func TestSettleFeesAboveMaxFee(t *testing.T) {
	ctx := context.Background()
	next := nextBaseFee(t)
	maxFee := new(big.Int).Sub(next, big.NewInt(1))
	var logs stacktest.SyncBuffer
	r := env.NewEngine(t, stacktest.EngineOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Config: withFees(facilitator.FeePolicy{MaxFee: maxFee}, nil)})
	if f := r.Fees(); len(f) != 1 || f[0].MaxFee.Cmp(maxFee) != 0 || f[0].Least != nil {
		t.Fatalf("before a reading: %+v", f)
	}
	payer := env.FundedPayer(t, 1_000)
	p := env.NewPay(t, payer, 1_000)
	_, err := r.SettleBody(ctx, t, p.Body(t))
	var fe *facilitator.Error
	if !errors.As(err, &fe) || fe.Code != facilitator.EUnavailable || fe.Reason != facilitator.ReasonFeesAboveCap || fe.RetryAfter <= 0 {
		t.Fatalf("want a 503 network_fees_above_cap with Retry-After, got %v", err)
	}
	if _, err := r.DB.SettlementByKey(ctx, p.Key()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("ledger row after a refusal: %v", err)
	}
	if n := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "pending"); n != 0 {
		t.Fatalf("signer's pending nonce %d: something was sent", n)
	}
	if got := env.Balance(t, p.PayTo); got != 0 {
		t.Fatalf("payee holds %d", got)
	}
	if f := r.Fees(); len(f) != 1 || f[0].Least == nil || f[0].Least.Cmp(maxFee) <= 0 || f[0].At.IsZero() {
		t.Fatalf("the reading: %+v, want a needed fee cap above the max fee %s", f, maxFee)
	}
	want := "max_fee_gwei=" + facilitator.Gwei(maxFee) + " needed_fee_cap_gwei="
	if line := logs.String(); !strings.Contains(line, want) || strings.Contains(line, " max_fee=") {
		t.Fatalf("the warning, want %q (units named):\n%s", want, line)
	}
}

// TestSettleFeeBumpPolicy: a replacement offers at least the network's bump percent more (25%
// here, above geth's 10) on tip and cap, or on the gas price of a legacy network's type-0
// transaction; the node takes it, and exactly one variant transfers.
func TestSettleFeeBumpPolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy facilitator.FeePolicy
		typ    uint8
	}{
		{"eip1559", facilitator.FeePolicy{BumpPercent: 25}, types.DynamicFeeTxType},
		{"legacy", facilitator.FeePolicy{Legacy: true, BumpPercent: 25}, types.LegacyTxType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			payer := env.FundedPayer(t, 2_000)
			env.ManualMining(t)
			r := env.NewEngine(t, stacktest.EngineOptions{Deadline: 500 * time.Millisecond,
				Config: withFees(tc.policy, func(c *settle.Config) { c.BumpAfter = 300 * time.Millisecond })})
			var gasPrice hexutil.Big
			if err := env.Chain.RPC.CallContext(ctx, &gasPrice, "eth_gasPrice"); err != nil {
				t.Fatal(err)
			}
			p := env.NewPay(t, payer, 2_000)
			body := p.Body(t)
			if out, err := r.SettleBody(ctx, t, body); err != nil || out.Response.ErrorReason != facilitator.ReasonSettlementPending {
				t.Fatalf("with no blocks, want settlement_pending: %+v %v", out.Response, err)
			}
			txs := bumped(t, r, 1)[0].Txs
			first, second := decodeTx(t, txs[0].Raw), decodeTx(t, txs[1].Raw)
			if first.Type() != tc.typ || second.Type() != tc.typ || first.Nonce() != second.Nonce() {
				t.Fatalf("types %d, %d (want %d), nonces %d, %d", first.Type(), second.Type(), tc.typ, first.Nonce(), second.Nonce())
			}
			if tc.policy.Legacy && first.GasPrice().Cmp(gasPrice.ToInt()) != 0 {
				t.Fatalf("legacy gas price %s, want the node's %s", first.GasPrice(), gasPrice.ToInt())
			}
			// The rule of a pool with a 25% price bump, in geth's integer form.
			if second.GasTipCap().Cmp(pct(first.GasTipCap(), 125)) < 0 || second.GasFeeCap().Cmp(pct(first.GasFeeCap(), 125)) < 0 {
				t.Fatalf("replacement %s/%s does not beat %s/%s by 25%%", second.GasTipCap(), second.GasFeeCap(), first.GasTipCap(), first.GasFeeCap())
			}
			if !env.InPool(t, second.Hash()) {
				t.Fatal("the node did not take the replacement")
			}

			rcpt := env.Receipt(t, mineUntilSettled(t, r, body))
			if rcpt.Type != tc.typ || rcpt.Status != types.ReceiptStatusSuccessful {
				t.Fatalf("mined receipt type %d status %d", rcpt.Type, rcpt.Status)
			}
			if got := env.Balance(t, p.PayTo); got != 2_000 {
				t.Fatalf("payee holds %d, want exactly 2000", got)
			}
			if n := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "latest"); n != 1 {
				t.Fatalf("signer nonce %d: the variants share one nonce", n)
			}
		})
	}
}
