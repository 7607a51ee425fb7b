package verify_test

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	gethhex "github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// fundedKey is a fresh key holding usdc of the token's units.
func fundedKey(t *testing.T, usdc int64) *ecdsa.PrivateKey {
	t.Helper()
	key := newKey(t)
	if err := chain.USDC.Mint(context.Background(), crypto.PubkeyToAddress(key.PublicKey), big.NewInt(usdc)); err != nil {
		t.Fatal(err)
	}
	return key
}

// paymentBy is a valid 1 USDC payment from key to payTo.
func paymentBy(t *testing.T, key *ecdsa.PrivateKey, payTo string) *payment {
	p := newPayment(t, 1)
	p.key, p.auth.From = key, crypto.PubkeyToAddress(key.PublicKey)
	p.auth.To, p.payTo = common.HexToAddress(payTo), payTo
	return p
}

// TestVerifyGroupedNotFundedByAnother: a caller's refused authorization, from a funded payer to
// an empty account X, and X's own payment go in one group of simulations, in that order. The
// first is refused for its recipient; X's payment is refused for X's balance (nothing), by
// Verify and by Settleable at a gas hint alike, as each is alone: the first's transfer, run in
// the group before it, does not fund it.
func TestVerifyGroupedNotFundedByAnother(t *testing.T) {
	groups := stacktest.NewSimGroups(chain.RPC)
	v := newVerifier(t, verify.Config{Readers: map[string]verify.Reader{network().ID: groups.Reader}})
	// A settle simulation estimates once per token; from then on it is a call at the hinted limit,
	// which goes in groups.
	if res, _ := settleable(t, v, newPayment(t, 1)); !res.IsValid {
		t.Fatalf("learning the gas hint: %s", res.InvalidReason)
	}

	for _, settling := range []bool{false, true} {
		name := "Verify"
		if settling {
			name = "Settleable"
		}
		t.Run(name, func(t *testing.T) { groupedNotFunded(t, v, groups, settling) })
	}
}

// groupedNotFunded is one round of TestVerifyGroupedNotFundedByAnother.
func groupedNotFunded(t *testing.T, v *verify.Verifier, groups *stacktest.SimGroups, settling bool) {
	x := newKey(t) // holds nothing
	merchant := randomAddress(t).Hex()
	funding := paymentBy(t, fundedKey(t, 1_000_000), crypto.PubkeyToAddress(x.PublicKey).Hex())
	funding.payTo = merchant // the requirements pay someone else: refused for its recipient
	own := paymentBy(t, x, merchant)

	// Decoded here: the callers run on goroutines of their own, which must not stop the test.
	decode := func(p *payment) *facilitator.Payment {
		pay, err := facilitator.DecodeRequest(p.body(t))
		if err != nil {
			t.Fatal(err)
		}
		return pay
	}
	first, fundingPay, ownPay := decode(newPayment(t, 2)), decode(funding), decode(own)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var fundingRes, ownRes facilitator.VerifyResponse
	var fundingErr, ownErr error
	var gas uint64
	groups.Group(t, func() {
		if res, err := v.Verify(ctx, first); err != nil || !res.IsValid {
			t.Errorf("first: %v %+v", err, res)
		}
	}, func() {
		fundingRes, fundingErr = v.Verify(ctx, fundingPay)
	}, func() {
		if settling {
			ownRes, gas, ownErr = v.Settleable(ctx, ownPay, chain.Accounts[0].Address)
		} else {
			ownRes, ownErr = v.Verify(ctx, ownPay)
		}
	})
	if fundingErr != nil || ownErr != nil {
		t.Fatalf("%v, %v", fundingErr, ownErr)
	}
	if fundingRes.IsValid || fundingRes.InvalidReason != facilitator.ReasonRecipientMismatch {
		t.Fatalf("the funding authorization: valid=%v reason=%s, want %s", fundingRes.IsValid, fundingRes.InvalidReason, facilitator.ReasonRecipientMismatch)
	}
	if ownRes.IsValid || ownRes.InvalidReason != facilitator.ReasonInsufficientBalance {
		t.Fatalf("X's own payment, X holding nothing: valid=%v reason=%s, want %s", ownRes.IsValid, ownRes.InvalidReason, facilitator.ReasonInsufficientBalance)
	}
	if gas != 0 {
		t.Fatalf("Settleable gave gas %d for an invalid payment", gas)
	}
}

// recordingChain records, per JSON-RPC method, the requests' arguments as JSON.
type recordingChain struct {
	ethrpc.Chain
	mu   sync.Mutex
	args map[string][]string
}

func (c *recordingChain) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	c.mu.Lock()
	for _, el := range b {
		j, _ := json.Marshal(el.Args)
		c.args[el.Method] = append(c.args[el.Method], strings.ToLower(string(j)))
	}
	c.mu.Unlock()
	return c.Chain.BatchCallContext(ctx, b)
}

// carrying counts the method's requests whose arguments hold data.
func (c *recordingChain) carrying(method string, data []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.args[method] {
		if strings.Contains(a, gethhex.Encode(data)) {
			n++
		}
	}
	return n
}

// TestVerifyGroupedWalletAlone: a contract wallet's isValidSignature, which the token calls in the
// simulation, may read any state, the group's earlier transfers included; so a wallet payer's
// success in a group is judged again alone (beside verify's own isValidSignature call).
func TestVerifyGroupedWalletAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner := newKey(t)
	wallet, err := chain.DeploySmartWallet(ctx, crypto.PubkeyToAddress(owner.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.USDC.Mint(ctx, wallet, big.NewInt(1_000_000)); err != nil {
		t.Fatal(err)
	}
	node := &recordingChain{Chain: chain.RPC, args: map[string][]string{}}
	groups := stacktest.NewSimGroups(node)
	v := newVerifier(t, verify.Config{Readers: map[string]verify.Reader{network().ID: groups.Reader}})
	wp := newPayment(t, 1)
	wp.key, wp.auth.From = owner, wallet
	decode := func(p *payment) *facilitator.Payment {
		pay, err := facilitator.DecodeRequest(p.body(t))
		if err != nil {
			t.Fatal(err)
		}
		return pay
	}
	first, walletPay, other := decode(newPayment(t, 2)), decode(wp), decode(paymentBy(t, fundedKey(t, 1_000_000), randomAddress(t).Hex()))
	var res [2]facilitator.VerifyResponse
	var errs [2]error
	groups.Group(t, func() {
		if r, err := v.Verify(ctx, first); err != nil || !r.IsValid {
			t.Errorf("first: %v %+v", err, r)
		}
	}, func() { res[0], errs[0] = v.Verify(ctx, other) }, func() { res[1], errs[1] = v.Verify(ctx, walletPay) })
	for i, name := range []string{"an EOA's payment", "the wallet's payment"} {
		if errs[i] != nil || !res[i].IsValid {
			t.Fatalf("%s: %v valid=%v %s", name, errs[i], res[i].IsValid, res[i].InvalidReason)
		}
	}
	data := eip3009.TransferCalldata(walletPay.Authorization, walletPay.Signature)
	if n := node.carrying("eth_simulateV1", data); n != 1 {
		t.Fatalf("the wallet's transfer in %d eth_simulateV1, want its group's", n)
	}
	if n := node.carrying("eth_call", data); n != 1 {
		t.Fatalf("the wallet's transfer simulated alone %d times after its group, want once", n)
	}
}
