package api_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"math/big"
	"net/http"
	"os"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// examplePath is the sample /verify body the README's curl (scripts/sample-verify.sh) sends to
// the local stack ('facilitator-dev dev').
const examplePath = "../examples/verify-v2.json"

var writeExample = flag.Bool("write-example", false, "rewrite "+examplePath+" from the current devchain")

// exampleRequest is the sample: dev account #1 pays 0.01 USDC to dev account #2 on the local
// stack's chain, valid until 2100, with a fixed nonce, in the shape the official 2.27 client and
// resource server put on the wire. ECDSA signing is deterministic (RFC 6979), so the file is
// reproducible byte for byte.
func exampleRequest(t *testing.T) []byte {
	t.Helper()
	payer, payee := chain.Accounts[1], chain.Accounts[2]
	auth := devchain.TransferAuthorization{
		From: payer.Address, To: payee.Address, Value: big.NewInt(10_000),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(4102444800), // 2100-01-01
		Nonce: crypto.Keccak256Hash([]byte("x402-facilitator examples/verify-v2.json")),
	}
	sig, err := chain.USDC.SignTransferAuthorization(payer.Key, auth)
	if err != nil {
		t.Fatal(err)
	}
	// Structs rather than maps keep the official client's key order.
	type extra struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	type requirements struct {
		Scheme            string `json:"scheme"`
		Network           string `json:"network"`
		Amount            string `json:"amount"`
		Asset             string `json:"asset"`
		PayTo             string `json:"payTo"`
		MaxTimeoutSeconds int    `json:"maxTimeoutSeconds"`
		Extra             extra  `json:"extra"`
	}
	type authorization struct {
		From        string `json:"from"`
		To          string `json:"to"`
		Value       string `json:"value"`
		ValidAfter  string `json:"validAfter"`
		ValidBefore string `json:"validBefore"`
		Nonce       string `json:"nonce"`
	}
	type exactPayload struct {
		Authorization authorization `json:"authorization"`
		Signature     string        `json:"signature"`
	}
	type resource struct {
		URL         string `json:"url"`
		Description string `json:"description"`
		MimeType    string `json:"mimeType"`
	}
	type paymentPayload struct {
		X402Version int            `json:"x402Version"`
		Payload     exactPayload   `json:"payload"`
		Resource    resource       `json:"resource"`
		Accepted    requirements   `json:"accepted"`
		Extensions  map[string]any `json:"extensions"`
	}
	type request struct {
		X402Version         int            `json:"x402Version"`
		PaymentPayload      paymentPayload `json:"paymentPayload"`
		PaymentRequirements requirements   `json:"paymentRequirements"`
	}
	reqs := requirements{
		Scheme: "exact", Network: facilitator.CAIP2(chain.ChainID), Amount: auth.Value.String(),
		Asset: chain.USDC.Address.Hex(), PayTo: payee.Address.Hex(), MaxTimeoutSeconds: 60,
		Extra: extra{Name: chain.USDC.Name, Version: chain.USDC.Version},
	}
	req := request{
		X402Version: 2,
		PaymentPayload: paymentPayload{
			X402Version: 2,
			Payload: exactPayload{
				Authorization: authorization{
					From: auth.From.Hex(), To: auth.To.Hex(), Value: auth.Value.String(),
					ValidAfter: auth.ValidAfter.String(), ValidBefore: auth.ValidBefore.String(),
					Nonce: "0x" + common.Bytes2Hex(auth.Nonce[:]),
				},
				Signature: "0x" + common.Bytes2Hex(sig),
			},
			Resource:   resource{URL: "http://localhost:3000/weather", Description: "Weather report", MimeType: "application/json"},
			Accepted:   reqs,
			Extensions: map[string]any{},
		},
		PaymentRequirements: reqs,
	}
	b, err := json.MarshalIndent(req, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestExampleVerifies keeps examples/verify-v2.json honest: it must be what the local stack's
// chain expects (same USDC address, chain and dev keys) and verify as valid.
// 'go test ./api/ -run TestExampleVerifies -write-example' regenerates it.
func TestExampleVerifies(t *testing.T) {
	if chain.ChainID != devchain.DefaultChainID {
		t.Fatalf("devchain runs chain %d, the example is for the local stack's %d", chain.ChainID, devchain.DefaultChainID)
	}
	if *writeExample {
		if err := os.MkdirAll("../examples", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(examplePath, exampleRequest(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	body, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		PaymentPayload struct {
			Accepted struct {
				Asset   string `json:"asset"`
				Network string `json:"network"`
			} `json:"accepted"`
		} `json:"paymentPayload"`
		PaymentRequirements struct {
			Asset   string `json:"asset"`
			Network string `json:"network"`
		} `json:"paymentRequirements"`
	}
	if err := json.Unmarshal(body, &ex); err != nil {
		t.Fatalf("%s: %v", examplePath, err)
	}
	for _, asset := range []string{ex.PaymentRequirements.Asset, ex.PaymentPayload.Accepted.Asset} {
		if !common.IsHexAddress(asset) || common.HexToAddress(asset) != chain.USDC.Address {
			t.Fatalf("%s pays in %s, but the local stack's USDC is at %s", examplePath, asset, chain.USDC.Address.Hex())
		}
	}
	if n := facilitator.CAIP2(chain.ChainID); ex.PaymentRequirements.Network != n || ex.PaymentPayload.Accepted.Network != n {
		t.Fatalf("%s is for %s, the local stack serves %s", examplePath, ex.PaymentRequirements.Network, n)
	}
	if want := exampleRequest(t); !bytes.Equal(body, want) {
		t.Fatalf("%s differs from what its generator produces; run 'go test ./api/ -run TestExampleVerifies -write-example'\nwant:\n%s", examplePath, want)
	}

	s := newStack(t, stackOptions{})
	r := s.verify(t, body)
	res, _ := verdict(t, r)
	if r.Status != http.StatusOK || !res.IsValid || res.Payer != chain.Accounts[1].Address.Hex() {
		t.Fatalf("want 200 valid from dev account #1, got %s", r)
	}
}
