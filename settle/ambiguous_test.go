package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// ambiguousLedger commits a settlement insert and then, while armed, reports an error (the
// answer was lost) and refuses the next reads of the authorization's row: the engine cannot tell
// whether its write committed until the ledger answers again.
type ambiguousLedger struct {
	settle.Store
	armed      atomic.Bool
	blindReads atomic.Int32 // SettlementByKey calls left that fail
}

func (a *ambiguousLedger) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	id, err := a.Store.InsertSettlement(ctx, s)
	if err == nil && a.armed.CompareAndSwap(true, false) {
		a.blindReads.Store(2)
		return 0, errLost
	}
	return id, err
}

func (a *ambiguousLedger) SettlementByKey(ctx context.Context, k facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	if a.blindReads.Add(-1) >= 0 {
		return nil, errors.New("ledger unreachable")
	}
	return a.Store.SettlementByKey(ctx, k)
}

// TestSettleAmbiguousCommitAnswersPending: the settlement insert commits but its answer is lost,
// and the read that would tell is refused too. The row and its signed transaction are in the
// ledger, so "nothing was sent, retry" would be false (a client believing it signs again and
// pays twice): the answer is settlement_pending with the transaction's hash, the engine finds out
// in the background that the row committed and sends it, and the same payload sent again gets the
// success. Exactly one transfer.
func TestSettleAmbiguousCommitAnswersPending(t *testing.T) {
	var store *ambiguousLedger
	signer := env.NewSigner(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 2 * time.Second, Config: func(c *settle.Config) {
		store = &ambiguousLedger{Store: c.Store}
		c.Store = store
		c.RetryInterval = 100 * time.Millisecond
	}})
	p := env.NewPay(t, env.FundedPayer(t, 10_000), 10_000)
	body := p.Body(t)
	payee := env.Balance(t, p.PayTo)
	ctx := context.Background()
	store.armed.Store(true)

	out, err := r.SettleBody(ctx, t, body)
	if err != nil {
		t.Fatalf("settle through an ambiguous commit: %v; want a settlement_pending answer, not an error saying nothing was sent", err)
	}
	// The background check may find the row within the deadline: then the caller gets the success
	// itself; otherwise pending with the hash, and its retry the success.
	if out.Response.Transaction == "" || (!out.Response.Success && out.Response.ErrorReason != facilitator.ReasonSettlementPending) {
		t.Fatalf("answer %+v, want settlement_pending (or success) with the hash", out.Response)
	}
	row := waitRow(t, p.Key(), 20*time.Second, func(s *facilitator.Settlement) bool { return s.State.Succeeded() })
	if row.TxHash != common.HexToHash(out.Response.Transaction) {
		t.Fatalf("mined %s, but the answer named %s", row.TxHash, out.Response.Transaction)
	}
	if !out.Response.Success {
		again := r.MustSettle(t, body)
		if !again.Response.Success || again.Response.Transaction != out.Response.Transaction {
			t.Fatalf("the same payload again: %+v, want the success", again.Response)
		}
	}
	if got := env.Balance(t, p.PayTo) - payee; got != 10_000 {
		t.Fatalf("payee received %d, want exactly one transfer of 10000", got)
	}
}

// lostBumpLedger commits every fee bump (AddTx) and, while armed, loses each answer.
type lostBumpLedger struct {
	settle.Store
	armed atomic.Bool
	lost  atomic.Int32
}

func (l *lostBumpLedger) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	err := l.Store.AddTx(ctx, id, tx)
	if l.armed.Load() && (err == nil || errors.Is(err, facilitator.ErrDuplicate)) {
		l.lost.Add(1)
		return errLost
	}
	return err
}

// TestLostBumpSentElsewhereIsOurs: a fee bump's ledger write commits and its answer is lost, so
// the engine never sends it; but the ledger holds it, and another process sends the ledger's
// bytes (the reconcile job's resend of a stale row does exactly that). When it is mined, the
// settlement is ours, mined, and its caller is told success: before, the engine did not know the
// variant, read the authorization's use log as another party's, and answered the payment it had
// made "used by a transaction that is not ours" (the simulator's seed 2549).
func TestLostBumpSentElsewhereIsOurs(t *testing.T) {
	var store *lostBumpLedger
	signer := env.NewSigner(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second, Config: func(c *settle.Config) {
		store = &lostBumpLedger{Store: c.Store}
		c.Store = store
		c.RetryInterval, c.BumpAfter, c.RebroadcastAfter = 100*time.Millisecond, 300*time.Millisecond, time.Hour
	}})
	p := env.NewPay(t, env.FundedPayer(t, 10_000), 10_000)
	body := p.Body(t)
	payee := env.Balance(t, p.PayTo)
	ctx := context.Background()
	env.ManualMining(t)
	store.armed.Store(true)
	first := r.SettlePending(t, body)

	// Wait for a bump the engine does not know it recorded.
	var bump facilitator.TxRecord
	for limit := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		open, err := env.DB.OpenSettlements(ctx, r.Network.ID, stacktest.AddressOf(signer))
		if err != nil {
			t.Fatal(err)
		}
		if len(open) == 1 && len(open[0].Txs) > 1 && store.lost.Load() > 0 {
			bump = open[0].Txs[len(open[0].Txs)-1]
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("no fee bump recorded within 20 s (open %+v, answers lost %d)", open, store.lost.Load())
		}
	}
	store.armed.Store(false)
	if env.InPool(t, bump.Hash) {
		t.Fatalf("the engine sent %s, whose ledger write it was told failed", bump.Hash)
	}
	// Another process sends the ledger's bytes, and they are mined.
	if err := env.Chain.RPC.CallContext(ctx, nil, "eth_sendRawTransaction", hexutil.Bytes(bump.Raw)); err != nil {
		t.Fatalf("sending the ledger's bump: %v", err)
	}
	env.SetAutomine(t, true)
	env.Mine(t)
	if rc := env.Receipt(t, bump.Hash); rc == nil || rc.Status != 1 {
		t.Fatalf("the bump's receipt: %+v", rc)
	}
	row := waitRow(t, p.Key(), 30*time.Second, func(s *facilitator.Settlement) bool { return !s.State.Open() })
	if row.State != facilitator.StateMined && row.State != facilitator.StateFinal || row.TxHash != bump.Hash {
		t.Fatalf("the settlement after our bump was mined: %s %s (%s), want mined by %s (first %s)", row.State, row.TxHash, row.ErrorReason, bump.Hash, first)
	}
	if out := r.MustSettle(t, body); !out.Response.Success || out.Response.Transaction != bump.Hash.Hex() {
		t.Fatalf("the same payload again: %+v, want the success with %s", out.Response, bump.Hash)
	}
	if got := env.Balance(t, p.PayTo) - payee; got != 10_000 {
		t.Fatalf("payee received %d, want exactly one transfer of 10000", got)
	}
}
