package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// post is do for a caller on a goroutine of its own: it returns its error rather than stop the
// test.
func post(u string, body []byte) (response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: b}, nil
}

// fundingAndOwn are two payments of one group's: an authorization from a payer holding the amount
// to an account X that holds nothing, with requirements that pay a merchant (refused for its
// recipient), and X's own payment to that merchant.
func fundingAndOwn(t *testing.T) (funding, own []byte, x common.Address) {
	t.Helper()
	xKey, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	x = crypto.PubkeyToAddress(xKey.PublicKey)
	f := fundedPayment(t)
	f.auth.To = x
	o := paymentFrom(t, xKey)
	merchant := o.auth.To.Hex()
	m := f.request(t)
	set(m, "paymentRequirements.payTo", merchant)
	set(m, "paymentPayload.accepted.payTo", merchant)
	return marshal(t, m), o.body(t), x
}

// groupOf runs first (held at the node) and then each of rest, in order, as one group of
// simulations behind it, each a POST of its body to its path; it returns rest's answers.
func groupOf(t *testing.T, groups *stacktest.SimGroups, url string, first []byte, rest ...[2]string) []response {
	t.Helper()
	out := make([]response, len(rest))
	errs := make([]error, len(rest))
	var calls []func()
	for i, r := range rest {
		calls = append(calls, func() { out[i], errs[i] = post(url+r[0], []byte(r[1])) })
	}
	var firstRes response
	var firstErr error
	groups.Group(t, func() { firstRes, firstErr = post(url+"/verify", first) }, calls...)
	if firstErr != nil || !bytes.HasPrefix(firstRes.Body, []byte(`{"isValid":true`)) {
		t.Fatalf("the first, in flight: %v %s", firstErr, firstRes)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", rest[i][0], err)
		}
	}
	return out
}

// TestVerifyGroupedNotFundedByAnother: concurrent /verify requests whose simulations go in one
// group. A caller (no API key, no cost) sends an authorization from a funded payer to an empty
// account X, refused for its recipient; X's own payment after it in the group is refused for X's
// balance, as it is alone: the refused one's simulated transfer does not fund it.
func TestVerifyGroupedNotFundedByAnother(t *testing.T) {
	groups := stacktest.NewSimGroups(chain.RPC)
	s := newStack(t, stackOptions{Reader: groups.Reader})
	funding, own, _ := fundingAndOwn(t)
	got := groupOf(t, groups, s.URL, newPayment(t, 1).body(t), [2]string{"/verify", string(funding)}, [2]string{"/verify", string(own)})
	if res, _ := verdict(t, got[0]); got[0].Status != http.StatusOK || res.IsValid || res.InvalidReason != facilitator.ReasonRecipientMismatch {
		t.Fatalf("the funding authorization: want 200 %s, got %s", facilitator.ReasonRecipientMismatch, got[0])
	}
	if res, _ := verdict(t, got[1]); got[1].Status != http.StatusOK || res.IsValid || res.InvalidReason != facilitator.ReasonInsufficientBalance {
		t.Fatalf("X's own payment, X holding nothing: want 200 %s, got %s", facilitator.ReasonInsufficientBalance, got[1])
	}
}

// TestSettleGroupedNotFundedByAnother: as TestVerifyGroupedNotFundedByAnother, with X's payment
// sent to /settle once the verifier has a gas hint (its simulation is then a call that goes in
// groups): it is refused for X's balance and nothing is signed, sent or written for it.
func TestSettleGroupedNotFundedByAnother(t *testing.T) {
	var groups *stacktest.SimGroups
	s := newSettleStack(t, settleOptions{reader: func(c ethrpc.Chain) *ethrpc.Reader {
		groups = stacktest.NewSimGroups(c)
		return groups.Reader
	}})
	// The first settlement of the token estimates its gas; later ones are calls at the hint.
	if res, _ := settlement(t, s.settle(t, fundedPayment(t).body(t))); !res.Success {
		t.Fatalf("learning the gas hint: %+v", res)
	}
	before := s.nonces(t)
	funding, own, x := fundingAndOwn(t)
	got := groupOf(t, groups, s.URL, newPayment(t, 1).body(t), [2]string{"/verify", string(funding)}, [2]string{"/settle", string(own)})
	if res, _ := verdict(t, got[0]); res.IsValid || res.InvalidReason != facilitator.ReasonRecipientMismatch {
		t.Fatalf("the funding authorization: want %s, got %s", facilitator.ReasonRecipientMismatch, got[0])
	}
	res, keys := settlement(t, got[1])
	if got[1].Status != http.StatusOK || res.Success || res.ErrorReason != facilitator.ReasonInsufficientBalance || string(keys["transaction"]) != `""` {
		t.Fatalf("X's own payment, X holding nothing: want 200 %s with no transaction, got %s", facilitator.ReasonInsufficientBalance, got[1])
	}
	if after := s.nonces(t); after != before {
		t.Fatalf("signer nonces %v -> %v: something was sent", before, after)
	}
	var nonce [32]byte
	if err := decodeNonce(own, &nonce); err != nil {
		t.Fatal(err)
	}
	k := facilitator.AuthorizationKey{Network: facilitator.CAIP2(chain.ChainID), Asset: chain.USDC.Address, Payer: x, Nonce: nonce}
	if st, err := s.DB.SettlementByKey(context.Background(), k); err == nil && st.TxHash != (common.Hash{}) {
		t.Fatalf("a settlement was signed for X's payment: %+v", st)
	}
	if b := usdcOf(t, x); b != 0 {
		t.Fatalf("X holds %d", b)
	}
}

// decodeNonce reads the authorization's nonce from a request body.
func decodeNonce(body []byte, nonce *[32]byte) error {
	p, err := facilitator.DecodeRequest(body)
	if err != nil {
		return fmt.Errorf("decoding the request: %w", err)
	}
	*nonce = p.Authorization.Nonce
	return nil
}
