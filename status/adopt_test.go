package status_test

import (
	"context"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// TestStatusSettledByOurLostRow: the ledger lost the row of a settlement whose transaction
// mined (a failover, a restore). The authorization's use, from the chain before the index has
// it and from the index after, was sent by one of the network's signer keys: settled by the
// facilitator, not by another party.
func TestStatusSettledByOurLostRow(t *testing.T) {
	ctx := context.Background()
	p, out, svc := lostSettlement(t, 55_000, env.Chain.RPC)

	if env.Use(t, p.Key()) == nil {
		st, _, err := svc.Authorization(ctx, p.Key())
		if err != nil || st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Basis != "chain" {
			t.Fatalf("status from the chain: %+v %v, want settled by the facilitator", st, err)
		}
	}
	env.StartIndexer(t)
	env.Mine(t)
	env.WaitIndexed(t, env.Head(t))
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found || st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Basis != "index" ||
		st.Transaction != out.Response.Transaction {
		t.Fatalf("status from the index: %+v %v %v, want settled by the facilitator with %s", st, found, err, out.Response.Transaction)
	}
}

// withholding is a node that does not give transactions by hash (a pruned transaction index, a
// provider that withholds them); every other call goes through.
type withholding struct{ ethrpc.Chain }

func (w withholding) CallContext(ctx context.Context, result any, method string, args ...any) error {
	if method == "eth_getTransactionByHash" {
		return nil // null: the node does not know it
	}
	return w.Chain.CallContext(ctx, result, method, args...)
}

func (w withholding) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	for i := range b {
		if b[i].Method == "eth_getTransactionByHash" {
			b[i].Method = "web3_clientVersion" // answered, and decoded as no transaction
			b[i].Args = nil
			b[i].Result = new(string)
		}
	}
	return w.Chain.BatchCallContext(ctx, b)
}

// TestStatusSettledByUnknownWhenWithheld: a node that withholds the transaction that used an
// authorization the ledger lost cannot make it another party's: the answer is settled, with
// settledBy left out (not known yet), never "other" for a transfer our key made.
func TestStatusSettledByUnknownWhenWithheld(t *testing.T) {
	ctx := context.Background()
	p, out, svc := lostSettlement(t, 45_000, withholding{env.Chain.RPC})
	st, _, err := svc.Authorization(ctx, p.Key())
	if err != nil || st.State != facilitator.StatusSettled || st.SettledBy != "" || st.Transaction != out.Response.Transaction {
		t.Fatalf("status with the transaction withheld: %+v %v, want settled, settledBy not known", st, err)
	}
}

// lostSettlement settles a payment of value on a fresh engine, has the ledger lose its row (a
// failover, a restore), and returns the payment, its answer, and a status service that reads
// the chain through head and knows the engine's key (finality by depth 2).
func lostSettlement(t *testing.T, value int64, head ethrpc.Chain) (stacktest.Pay, facilitator.SettleOutcome, *status.Service) {
	t.Helper()
	e := env.NewEngine(t, stacktest.EngineOptions{})
	addr := crypto.PubkeyToAddress(e.Signer().PublicKey)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), value)
	out := e.MustSucceed(t, p.Body(t))
	env.LoseSettlements(t, out.SettlementID)
	n := env.Network()
	n.Finality = facilitator.Finality{Depth: 2}
	return p, out, status.New(env.DB, []status.Network{{Network: n, Head: head, Signers: []common.Address{addr}}}, nil)
}
