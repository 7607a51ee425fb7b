package verify_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// recordingReader reads through anvil and records the simulations asked for; squeeze, when set,
// lowers the gas limit of every capped call to it (a hint too small for the transfer).
type recordingReader struct {
	verify.Reader
	squeeze uint64

	mu        sync.Mutex
	estimates int
	capped    []uint64
}

func (r *recordingReader) Read(ctx context.Context, reads ...*ethrpc.Read) error {
	r.mu.Lock()
	for _, rd := range reads {
		switch {
		case rd.Estimate:
			r.estimates++
		case rd.GasCap > 0:
			r.capped = append(r.capped, rd.GasCap)
			if r.squeeze > 0 {
				rd.GasCap = r.squeeze
			}
		}
	}
	r.mu.Unlock()
	return r.Reader.Read(ctx, reads...)
}

func (r *recordingReader) take() (estimates int, capped []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	estimates, capped = r.estimates, r.capped
	r.estimates, r.capped = 0, nil
	return estimates, capped
}

func settleable(t *testing.T, v *verify.Verifier, p *payment) (facilitator.VerifyResponse, uint64) {
	t.Helper()
	pay, err := facilitator.DecodeRequest(p.body(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, gas, err := v.Settleable(ctx, pay, chain.Accounts[0].Address)
	if err != nil {
		t.Fatalf("Settleable: %v", err)
	}
	return res, gas
}

// The settle simulation estimates gas once per token, then proves each later EOA payment with one
// eth_call at the limit the transaction will be signed with; a failing call falls back to the
// estimate, whose verdict stands.
func TestSettleableGasHint(t *testing.T) {
	rr := &recordingReader{Reader: &ethrpc.Reader{Chain: chain.RPC, Timeout: 5 * time.Second}}
	v := newVerifier(t, verify.Config{Readers: map[string]verify.Reader{network().ID: rr}})

	res, first := settleable(t, v, newPayment(t, 1))
	if est, capped := rr.take(); !res.IsValid || first == 0 || est != 1 || len(capped) != 0 {
		t.Fatalf("first settle simulation: valid=%v gas=%d estimates=%d capped=%v; want valid, an estimate, no capped call", res.IsValid, first, est, capped)
	}

	res, gas := settleable(t, v, newPayment(t, 2))
	if est, capped := rr.take(); !res.IsValid || gas != first || est != 0 || len(capped) != 1 || capped[0] != eip3009.GasLimit(first) {
		t.Fatalf("hinted settle simulation: valid=%v gas=%d estimates=%d capped=%v; want valid, gas %d, one call capped at %d",
			res.IsValid, gas, est, capped, first, eip3009.GasLimit(first))
	}

	// A payer without USDC: the capped call reverts, the estimate confirms it, the diagnosis names it.
	broke := newPayment(t, 1)
	broke.key = newKey(t)
	broke.auth.From = crypto.PubkeyToAddress(broke.key.PublicKey)
	res, _ = settleable(t, v, broke)
	if est, _ := rr.take(); res.IsValid || res.InvalidReason != facilitator.ReasonInsufficientBalance || est != 1 {
		t.Fatalf("hinted simulation of an unfunded payer: valid=%v reason=%s estimates=%d; want insufficient balance after one estimate", res.IsValid, res.InvalidReason, est)
	}

	// A hint too small for the transfer: the call runs out of gas, which is not a verdict; the
	// estimate decides (valid) and the limit follows the estimate.
	rr.squeeze = 30_000
	res, gas = settleable(t, v, newPayment(t, 3))
	if est, capped := rr.take(); !res.IsValid || gas == 0 || est != 1 || len(capped) != 1 {
		t.Fatalf("simulation with a hint too small: valid=%v (%s %s) gas=%d estimates=%d capped=%v; want valid after one estimate",
			res.IsValid, res.InvalidReason, res.InvalidMessage, gas, est, capped)
	}
}
