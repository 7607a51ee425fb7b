package settle_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// Finality by the chain's word, on anvil, which serves the "finalized" tag 64 blocks below its
// head (two epochs of 32 slots) and "safe" 32 below: a settlement is final once its block is at
// or below the node's finalized block, however deep it is by count before that.

// tagChain is anvil seen through a node whose answers for the "finalized" tag the test chooses:
// as anvil's (and recorded), refused as a node that does not serve the tag, or a block above its
// own head (rewritten to "pending", which anvil answers with head + 1).
type tagChain struct {
	ethrpc.Chain
	mode string // "", "refuse", "above"

	mu      sync.Mutex
	answers []uint64 // the finalized block of every answered read, in order
}

func (c *tagChain) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	var tags []int
	for i := range b {
		if b[i].Method == "eth_getBlockByNumber" && len(b[i].Args) > 0 && b[i].Args[0] == facilitator.TagFinalized {
			tags = append(tags, i)
			if c.mode == "above" {
				b[i].Args = []any{"pending", false}
			}
		}
	}
	if err := c.Chain.BatchCallContext(ctx, b); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, i := range tags {
		if c.mode == "refuse" {
			b[i].Error = errors.New("invalid block tag: finalized")
			continue
		}
		if a := ethrpc.TagAnswer(b[i]); a.OK {
			c.answers = append(c.answers, a.Number)
		}
	}
	return nil
}

// reads is how many tag reads were answered; highest is the highest finalized block answered.
func (c *tagChain) reads() (n int, highest uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.answers {
		highest = max(highest, a)
	}
	return len(c.answers), highest
}

func mineBlocks(t testing.TB, n int) {
	t.Helper()
	if err := env.Chain.RPC.CallContext(context.Background(), nil, "anvil_mine", hexutil.EncodeUint64(uint64(n))); err != nil {
		t.Fatal(err)
	}
}

// settleMined settles a fresh payment through an engine over chain with the finality rule tag
// and depth, and returns its mined ledger row.
func settleMined(t *testing.T, chain ethrpc.Chain, tag string, depth uint64) (*stacktest.Engine, stacktest.Pay, *facilitator.Settlement) {
	t.Helper()
	e := env.NewEngine(t, stacktest.EngineOptions{Chain: chain, Tag: tag, Depth: depth})
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 10_000)
	if out := e.MustSettle(t, p.Body(t)); !out.Response.Success {
		t.Fatalf("settle: %+v", out.Response)
	}
	row := env.Row(t, p.Key())
	if !row.State.Succeeded() {
		t.Fatalf("after a success the row is %s", row.State)
	}
	return e, p, row
}

func TestFinalByTag(t *testing.T) {
	chain := &tagChain{Chain: env.Chain.RPC}
	_, p, row := settleMined(t, chain, facilitator.TagFinalized, 1)
	// Ten blocks deep: final ten times over by depth 1, not by the tag (64 behind the head).
	mineBlocks(t, 10)
	before, _ := chain.reads()
	waitFor(t, 20*time.Second, "three more rounds reading the tag", func() bool { n, _ := chain.reads(); return n >= before+3 })
	row = env.Row(t, p.Key())
	if _, highest := chain.reads(); row.State == facilitator.StateFinal && highest < row.BlockNumber {
		t.Fatalf("final at block %d while the node's finalized block was at most %d", row.BlockNumber, highest)
	}
	if row.State != facilitator.StateMined {
		t.Fatalf("ten deep and above the finalized block: %s, want still mined", row.State)
	}
	// Once the finalized tag reaches the block, it is final.
	mineBlocks(t, 64)
	waitRow(t, p.Key(), 20*time.Second, func(s *facilitator.Settlement) bool { return s.State == facilitator.StateFinal })
	if _, highest := chain.reads(); highest < row.BlockNumber {
		t.Fatalf("final while the node's finalized block was at most %d, below the settlement's %d", highest, row.BlockNumber)
	}
	// The finalized tag said so: status agrees, by the same rule (from its second answer: one
	// answer alone never says where the tag stands).
	status := env.StatusBy(env.DB, facilitator.Finality{Tag: facilitator.TagFinalized, Depth: 1})
	if _, _, err := status.Authorization(context.Background(), p.Key()); err != nil {
		t.Fatal(err)
	}
	st, found, err := status.Authorization(context.Background(), p.Key())
	if err != nil || !found || !st.Final || st.Finality.Rule != "tag:finalized" || st.Finality.FinalBlock < row.BlockNumber {
		t.Fatalf("status once final: %+v (finality %+v), found %v, err %v", st, st.Finality, found, err)
	}
}

func TestFinalTagRefusedFallsBackToDepth(t *testing.T) {
	chain := &tagChain{Chain: env.Chain.RPC, mode: "refuse"}
	_, p, _ := settleMined(t, chain, facilitator.TagFinalized, 3)
	// Three deep by count: final, though the node never said what is finalized.
	mineBlocks(t, 3)
	waitRow(t, p.Key(), 20*time.Second, func(s *facilitator.Settlement) bool { return s.State == facilitator.StateFinal })
}

func TestFinalTagAboveHeadIsNotFinal(t *testing.T) {
	chain := &tagChain{Chain: env.Chain.RPC, mode: "above"}
	_, p, _ := settleMined(t, chain, facilitator.TagFinalized, 1)
	// A node that calls a block above its own head finalized is wrong about something: neither
	// its tag nor a depth fallback makes the settlement final, however deep.
	mineBlocks(t, 80)
	before, _ := chain.reads()
	waitFor(t, 20*time.Second, "three more rounds reading the tag", func() bool { n, _ := chain.reads(); return n >= before+3 })
	if row := env.Row(t, p.Key()); row.State != facilitator.StateMined {
		t.Fatalf("on a node whose finalized block is above its head: %s, want still mined", row.State)
	}
}
