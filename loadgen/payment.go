package loadgen

import (
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// token is the EIP-3009 token the payments are in, with its EIP-712 domain.
type token struct {
	Address       common.Address
	Name, Version string
	ChainID       uint64
	domain        common.Hash
}

func newToken(addr common.Address, name, version string, chainID uint64) token {
	return token{Address: addr, Name: name, Version: version, ChainID: chainID,
		domain: eip3009.DomainSeparator(name, version, chainID, addr)}
}

// payment is one signed authorization and the /verify-/settle body that carries it.
type payment struct {
	Auth      facilitator.Authorization
	Signature []byte
	Body      []byte
}

// paymentValue is what each payment moves: 0.001 USDC, so the dev accounts' million USDC last
// for a billion payments.
const paymentValue = 1000

// signPayment signs a fresh authorization (random nonce, a fresh random payee so that each
// payment's transfer can be told apart on chain) from key's account. A non-empty paymentID adds
// the payment-identifier extension (x402 v2 extensions) to the payload.
func signPayment(t token, key *ecdsa.PrivateKey, validFor time.Duration, paymentID string) (*payment, error) {
	var nonce [32]byte
	var payTo common.Address
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(payTo[:]); err != nil {
		return nil, err
	}
	a := facilitator.Authorization{
		From: crypto.PubkeyToAddress(key.PublicKey), To: payTo, Value: big.NewInt(paymentValue),
		ValidAfter: new(big.Int), ValidBefore: big.NewInt(time.Now().Add(validFor).Unix()), Nonce: nonce,
	}
	digest := eip3009.AuthorizationDigest(t.domain, a)
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		return nil, err
	}
	sig[64] += 27 // wallets send v as 27/28
	body, err := requestBody(t, a, sig, paymentID)
	if err != nil {
		return nil, err
	}
	return &payment{Auth: a, Signature: sig, Body: body}, nil
}

// requestBody is the v2 {x402Version, paymentPayload, paymentRequirements} body the official
// resource server would send.
func requestBody(t token, a facilitator.Authorization, sig []byte, paymentID string) ([]byte, error) {
	reqs := facilitator.PaymentRequirements{
		Scheme: "exact", Network: facilitator.CAIP2(t.ChainID), Amount: a.Value.String(), Asset: t.Address.Hex(),
		PayTo: a.To.Hex(), MaxTimeoutSeconds: 300,
	}
	extra, err := json.Marshal(map[string]string{"name": t.Name, "version": t.Version})
	if err != nil {
		return nil, err
	}
	reqs.Extra = extra
	inner, err := json.Marshal(facilitator.ExactEVMPayload{
		Signature: hexutil.Encode(sig),
		Authorization: &facilitator.ExactEVMAuthorization{
			From: a.From.Hex(), To: a.To.Hex(), Value: a.Value.String(),
			ValidAfter: a.ValidAfter.String(), ValidBefore: a.ValidBefore.String(), Nonce: hexutil.Encode(a.Nonce[:]),
		},
	})
	if err != nil {
		return nil, err
	}
	pp := facilitator.PaymentPayload{
		X402Version: 2, Resource: &facilitator.ResourceInfo{URL: "http://loadgen.invalid/bench"},
		Accepted: reqs, Payload: inner,
	}
	if paymentID != "" {
		ext, err := json.Marshal(map[string]any{"info": map[string]any{"required": false, "id": paymentID}})
		if err != nil {
			return nil, err
		}
		pp.Extensions = map[string]json.RawMessage{facilitator.PaymentIdentifierKey: ext}
	}
	ppRaw, err := json.Marshal(pp)
	if err != nil {
		return nil, err
	}
	reqRaw, err := json.Marshal(reqs)
	if err != nil {
		return nil, err
	}
	return json.Marshal(facilitator.Request{X402Version: json.RawMessage(strconv.Itoa(2)), PaymentPayload: ppRaw, PaymentRequirements: reqRaw})
}

// newPaymentID is an id in the shape the TS helper generates: "pay_" and 32 hex digits.
func newPaymentID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("payment id: %w", err)
	}
	return "pay_" + hex.EncodeToString(b[:]), nil
}

// signPayments signs n payments, taking payers in turn: signing happens before any clock starts.
func signPayments(t token, payers []*ecdsa.PrivateKey, n int, validFor time.Duration) ([]*payment, error) {
	out := make([]*payment, n)
	for i := range out {
		p, err := signPayment(t, payers[i%len(payers)], validFor, "")
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}
