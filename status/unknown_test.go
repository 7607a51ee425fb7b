package status_test

import (
	"context"
	"encoding/json"
	"math/big"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Status answers only what it read: a state it cannot tell apart from another is answered as
// what is known ("used", or an error to retry), never as a guess.

// TestStatusCanceledFarAboveTheIndex: a cancellation more blocks above the index than status
// reads logs over (the index far behind after a backfill, or stopped). authorizationState is true
// for a use and a cancel alike; with no log of which, the answer is "used", not "settled by
// other" (a merchant would serve an order nobody paid for).
func TestStatusCanceledFarAboveTheIndex(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 10_000)
	env.CancelAuthorization(t, payer, p.Nonce) // no indexer runs
	if err := env.Chain.RPC.CallContext(ctx, nil, "anvil_mine", hexutil.EncodeUint64(2_100)); err != nil {
		t.Fatal(err)
	}
	st, found, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil || found {
		t.Fatalf("found %v, err %v", found, err)
	}
	if st.State != facilitator.StatusUsed || st.SettledBy != "" || st.Basis != "chain" {
		t.Fatalf("status of a cancel 2,100 blocks above the index: %+v; want used (settled or canceled is not known)", st)
	}
}

// TestStatusRevertedThenUsedNotIndexed: our transaction reverted, then a third party settled the
// very authorization, and the index has not reached that block. "failed" would tell the payer
// to sign anew (and pay twice): the chain says it is used, and its log by whom.
func TestStatusRevertedThenUsedNotIndexed(t *testing.T) {
	ctx := context.Background()
	p, _ := revertedSettlement(t)
	if err := env.Chain.USDC.Mint(ctx, p.From(), big.NewInt(p.Value)); err != nil {
		t.Fatal(err)
	}
	theirs := p.SubmitElsewhere(t) // no indexer runs
	if env.Use(t, p.Key()) != nil {
		t.Fatal("the index has the use although no indexer runs")
	}
	st, _, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Transaction != theirs.Hex() {
		t.Fatalf("status: %+v, want settled by other with %s (read from the chain: the index does not reach it)", st, theirs)
	}
}

// TestStatusUnusedNotFromALaggingNode: the head is read from one node, the authorization's state
// from another that lags (a pool's rotation). The used authorization must never be answered
// "unused" from the lagging node's older state: the state is read at the head the answer names,
// which that node lacks, so the answer is an error to retry.
func TestStatusUnusedNotFromALaggingNode(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 10_000)
	before := env.Head(t)
	p.SubmitElsewhere(t)
	env.Mine(t)
	lag := &laggingNode{rpc: env.Chain.RPC, at: before}
	n := env.Network()
	n.Finality = facilitator.Finality{Depth: 2}
	svc := status.New(env.DB, []status.Network{{Network: n, Head: lag}}, nil)
	st, _, err := svc.Authorization(ctx, p.Key())
	if err == nil && st.State == facilitator.StatusUnused {
		t.Fatalf("status read through a node at block %d (the use is above it): %+v; want no \"unused\"", before, st)
	}
	if err != nil && !strings.Contains(err.Error(), "could not read") {
		t.Fatalf("status through a lagging node: %v, want the chain unavailable", err)
	}
}

// laggingNode is a node at block at answering beside one that reports the real head: its
// eth_blockNumber is the other's (as a pool's rotation gives it), its state and logs are at its
// own block: "latest" is at, a block above it is unknown ("header not found", as geth answers).
type laggingNode struct {
	rpc interface {
		CallContext(ctx context.Context, result any, method string, args ...any) error
		BatchCallContext(ctx context.Context, b []rpc.BatchElem) error
	}
	at uint64
}

func (l *laggingNode) CallContext(ctx context.Context, result any, method string, args ...any) error {
	b := []rpc.BatchElem{{Method: method, Args: args, Result: result}}
	if err := l.BatchCallContext(ctx, b); err != nil {
		return err
	}
	return b[0].Error
}

func (l *laggingNode) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	for i := range b {
		el := &b[i]
		switch el.Method {
		case "eth_call":
			if len(el.Args) < 2 {
				el.Args = append(el.Args, "latest")
			}
			if !l.pin(el, 1) {
				continue
			}
		case "eth_getLogs":
			f, _ := json.Marshal(el.Args[0])
			var q map[string]any
			_ = json.Unmarshal(f, &q)
			if tb, _ := q["toBlock"].(string); tb != "" {
				args := []any{tb}
				probe := rpc.BatchElem{Method: el.Method, Args: args}
				if !l.pin(&probe, 0) {
					el.Error = probe.Error
					continue
				}
				q["toBlock"] = probe.Args[0]
			}
			el.Args = []any{q}
		}
		el.Error = l.rpc.CallContext(ctx, el.Result, el.Method, el.Args...)
	}
	return nil
}

// pin reads argument i as a block tag: "latest" becomes the node's block, a number above it
// fails the element. It reports whether the element is still to be asked.
func (l *laggingNode) pin(el *rpc.BatchElem, i int) bool {
	tag, _ := el.Args[i].(string)
	switch {
	case tag == "latest" || tag == "pending":
		el.Args[i] = hexutil.EncodeUint64(l.at)
	case strings.HasPrefix(tag, "0x"):
		if n, err := hexutil.DecodeUint64(tag); err == nil && n > l.at {
			el.Error = &headerNotFound{}
			return false
		}
	}
	return true
}

type headerNotFound struct{}

func (*headerNotFound) Error() string  { return "header not found" }
func (*headerNotFound) ErrorCode() int { return -32000 }
