package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"math/big"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// remoteSigners are the remote signers the engine's settle and crash tests run against: the
// real Clef, and our narrow signer (which speaks the same API).
var remoteSigners = []struct {
	name  string
	start func(t *testing.T, key *ecdsa.PrivateKey) []settle.Signer
}{
	{"clef", func(t *testing.T, key *ecdsa.PrivateKey) []settle.Signer {
		return stacktest.StartClef(t, env.Chain.ChainID, key).Signers(t, env.Chain.ChainID)
	}},
	{"narrow", func(t *testing.T, key *ecdsa.PrivateKey) []settle.Signer {
		return env.NarrowSigner(t, extsigner.Policy{MaxGas: 500_000, MaxFeeCap: big.NewInt(1e12)}, key)
	}},
}

// TestRemoteSignerSettleOnce: with the key behind a remote signer (the engine holds only its
// address), a payment settles once: the payee gets exactly the amount, the ledger row is the
// key's and mined, a repeat is already_settled, and the key sent one transaction.
func TestRemoteSignerSettleOnce(t *testing.T) {
	for _, rs := range remoteSigners {
		t.Run(rs.name, func(t *testing.T) {
			ctx := context.Background()
			key := env.NewSigner(t)
			addr := crypto.PubkeyToAddress(key.PublicKey)
			r := env.NewEngine(t, stacktest.EngineOptions{Remote: rs.start(t, key)})
			p := env.NewPay(t, env.FundedPayer(t, 2_000_000), 1_250_000)
			body := p.Body(t)

			out := r.MustSettle(t, body)
			if !out.Response.Success || out.Response.Transaction == "" || !out.Claimed {
				t.Fatalf("settle: %+v", out)
			}
			if got := env.Balance(t, p.PayTo); got != 1_250_000 {
				t.Fatalf("payee holds %d, want 1250000", got)
			}
			row, err := r.DB.SettlementByKey(ctx, p.Key())
			if err != nil {
				t.Fatal(err)
			}
			if !row.State.Succeeded() || row.Signer != addr || row.TxHash.Hex() != out.Response.Transaction || !row.Delivered {
				t.Fatalf("ledger row %+v, want mined by %s with %s", row, addr, out.Response.Transaction)
			}
			if rc := env.Receipt(t, row.TxHash); rc == nil || rc.Status != 1 {
				t.Fatalf("receipt %+v", rc)
			}
			again, err := r.SettleBody(ctx, t, body)
			if err != nil || again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled {
				t.Fatalf("repeat: %+v %v", again.Response, err)
			}
			if got := env.Balance(t, p.PayTo); got != 1_250_000 {
				t.Fatalf("payee holds %d after the repeat", got)
			}
			if n := nonceOf(t, addr, "latest"); n != 1 {
				t.Fatalf("the key sent %d transactions, want 1", n)
			}
		})
	}
}

// TestRemoteSignerNonceRecovery: the engine restart test local keys pass (five settlements
// pending when the engine stops, the node's pool lost, a new engine resends them from the ledger
// and settles three more), with the key behind each remote signer.
func TestRemoteSignerNonceRecovery(t *testing.T) {
	for _, rs := range remoteSigners {
		t.Run(rs.name, func(t *testing.T) { testNonceRecovery(t, true, rs.start) })
	}
}

// TestRemoteSignerDown: a signer that is down (Clef stopped) or refuses (the narrow signer's fee
// ceiling below the chain's fees) makes /settle answer 503 signer_unavailable: no ledger row,
// nothing in the pool, the key's nonce unused, the payee unpaid, and the answer does not name
// the signer. Once the signer is back, the same payload settles once.
func TestRemoteSignerDown(t *testing.T) {
	t.Run("clef stopped", func(t *testing.T) {
		key := env.NewSigner(t)
		clef := stacktest.StartClef(t, env.Chain.ChainID, key)
		r := env.NewEngine(t, stacktest.EngineOptions{Remote: clef.Signers(t, env.Chain.ChainID)})
		clef.Stop()
		p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 400_000)
		wantNothingSent(t, r, key, p, clef.URL)

		clef.Start()
		out := r.MustSettle(t, p.Body(t))
		if !out.Response.Success {
			t.Fatalf("after the signer is back: %+v", out.Response)
		}
		if got := env.Balance(t, p.PayTo); got != 400_000 {
			t.Fatalf("payee holds %d, want 400000", got)
		}
	})
	t.Run("narrow signer refuses", func(t *testing.T) {
		key := env.NewSigner(t)
		r := env.NewEngine(t, stacktest.EngineOptions{Remote: env.NarrowSigner(t, extsigner.Policy{MaxGas: 500_000, MaxFeeCap: big.NewInt(1)}, key)})
		p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 400_000)
		wantNothingSent(t, r, key, p, "127.0.0.1")
	})
}

func wantNothingSent(t *testing.T, r *stacktest.Engine, key *ecdsa.PrivateKey, p stacktest.Pay, where string) {
	t.Helper()
	ctx := context.Background()
	addr := crypto.PubkeyToAddress(key.PublicKey)
	out, err := r.SettleBody(ctx, t, p.Body(t))
	var fe *facilitator.Error
	if !errors.As(err, &fe) || fe.Code != facilitator.EUnavailable || fe.Reason != facilitator.ReasonSignerUnavailable {
		t.Fatalf("want 503 %s, got %+v %v", facilitator.ReasonSignerUnavailable, out.Response, err)
	}
	if msg := facilitator.ErrorMessage(err); strings.Contains(msg, where) || msg == "" {
		t.Fatalf("caller-facing message %q (must say what happened, never where the signer is)", msg)
	}
	if _, err := r.DB.SettlementByKey(ctx, p.Key()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("ledger row after a failed sign: %v, want none", err)
	}
	if n := nonceOf(t, addr, "pending"); n != 0 {
		t.Fatalf("the key's pending nonce is %d: something was broadcast", n)
	}
	if got := env.Balance(t, p.PayTo); got != 0 {
		t.Fatalf("payee holds %d", got)
	}
}

// lyingSigner is a remote signer that answers with a transaction other than the one asked for
// (a compromised or buggy signer, which no real Clef plays): edit changes the request first, or
// key signs in place of the one it claims.
type lyingSigner struct {
	addr common.Address
	key  *ethrpc.Signer
	edit func(*types.DynamicFeeTx)
}

func (l lyingSigner) Address() common.Address { return l.addr }
func (l lyingSigner) SignTx(ctx context.Context, tx types.TxData) (*types.Transaction, error) {
	t := *tx.(*types.DynamicFeeTx)
	l.edit(&t)
	return l.key.SignTx(ctx, &t)
}

// TestRemoteSignerAnswerChecked: what a remote signer answers is committed and broadcast only
// when it is the transaction asked for, signed by the key asked for; otherwise nothing is sent.
func TestRemoteSignerAnswerChecked(t *testing.T) {
	key := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(key.PublicKey)
	for _, tc := range []struct {
		name string
		s    lyingSigner
	}{
		{"higher fee", lyingSigner{addr, ethrpc.NewSigner(env.Chain.ChainID, key), func(tx *types.DynamicFeeTx) { tx.GasFeeCap = new(big.Int).Add(tx.GasFeeCap, big.NewInt(1)) }}},
		{"another recipient", lyingSigner{addr, ethrpc.NewSigner(env.Chain.ChainID, key), func(tx *types.DynamicFeeTx) { to := common.HexToAddress("0xdead"); tx.To = &to }}},
		{"another key", lyingSigner{addr, ethrpc.NewSigner(env.Chain.ChainID, env.NewSigner(t)), func(*types.DynamicFeeTx) {}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := env.NewEngine(t, stacktest.EngineOptions{Remote: []settle.Signer{tc.s}})
			wantNothingSent(t, r, key, env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000), "0xdead")
		})
	}
}

// countingSigner counts a remote signer's answers, so a test can tell the engine tried.
type countingSigner struct {
	settle.Signer
	signed, failed atomic.Int64
}

func (c *countingSigner) SignTx(ctx context.Context, tx types.TxData) (*types.Transaction, error) {
	s, err := c.Signer.SignTx(ctx, tx)
	if err != nil {
		c.failed.Add(1)
	} else {
		c.signed.Add(1)
	}
	return s, err
}

// TestRemoteSignerDownDuringBump: a fee bump the signer cannot sign (Clef stopped) is not a
// failure: the settlement stays open with its one transaction, still in the pool; once the signer
// is back the bump is signed and committed, and the payment settles once.
func TestRemoteSignerDownDuringBump(t *testing.T) {
	ctx := context.Background()
	key := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(key.PublicKey)
	clef := stacktest.StartClef(t, env.Chain.ChainID, key)
	cs := &countingSigner{Signer: clef.Signers(t, env.Chain.ChainID)[0]}
	p := env.NewPay(t, env.FundedPayer(t, 100_000), 100_000)
	body := p.Body(t)
	env.ManualMining(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Remote: []settle.Signer{cs}, Deadline: 1500 * time.Millisecond,
		Config: func(c *settle.Config) { c.BumpAfter = 300 * time.Millisecond }})
	answered := r.SettlePending(t, body)

	open := func() []facilitator.TxRecord {
		t.Helper()
		rows, err := r.DB.OpenSettlements(ctx, env.Network().ID, addr)
		if err != nil || len(rows) != 1 {
			t.Fatalf("open settlements %+v %v, want one", rows, err)
		}
		return rows[0].Txs
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited 15 s for %s", what)
			}
		}
	}
	if !slices.ContainsFunc(open(), func(tx facilitator.TxRecord) bool { return tx.Hash == answered }) {
		t.Fatalf("the pending answer's %s is none of the settlement's transactions", answered)
	}
	clef.Stop()
	// A bump signed just before the stop may still be on its way to the ledger; bumps of one
	// settlement run one after another, so once one has failed the earlier ones are recorded.
	failed := cs.failed.Load()
	waitFor("a bump attempt with the signer down", func() bool { return cs.failed.Load() > failed })
	before := open()
	failed = cs.failed.Load()
	waitFor("two more bump attempts with the signer down", func() bool { return cs.failed.Load() >= failed+2 })
	txs := open()
	if len(txs) != len(before) || txs[len(txs)-1].Hash != before[len(before)-1].Hash {
		t.Fatalf("with the signer down the settlement's variants went from %d to %d", len(before), len(txs))
	}
	if latest := txs[len(txs)-1].Hash; !env.InPool(t, latest) {
		t.Fatalf("the latest variant %s left the pool", latest)
	}

	clef.Start()
	waitFor("a bump once the signer is back", func() bool { return len(open()) > len(before) })
	env.SetAutomine(t, true)
	env.Mine(t)
	var final facilitator.SettleOutcome
	waitFor("the success", func() bool {
		var err error
		if final, err = r.SettleBody(ctx, t, body); err != nil {
			t.Fatal(err)
		}
		return final.Response.ErrorReason != facilitator.ReasonSettlementPending
	})
	if !final.Response.Success {
		t.Fatalf("after mining: %+v", final.Response)
	}
	if got := env.Balance(t, p.PayTo); got != 100_000 {
		t.Fatalf("payee holds %d, want exactly 100000", got)
	}
	if n := nonceOf(t, addr, "latest"); n != 1 {
		t.Fatalf("the key's nonce is %d, want 1: the variants share one", n)
	}
}
