package verify_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/math"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// chain is the anvil with real USDC shared by this package's tests; each test uses its own
// payers, nonces and recipients, so they do not interfere.
var chain *devchain.Chain

func TestMain(m *testing.M) {
	stacktest.MainWith(m, stacktest.Options{}, func(e *stacktest.Env) (int, error) {
		chain = e.Chain
		return m.Run(), nil
	})
}

// domain is an EIP-712 domain a test signs under; it need not be the token's.
type domain struct {
	Name, Version string
	ChainID       uint64
	Contract      common.Address
}

func usdcDomain() domain {
	return domain{Name: chain.USDC.Name, Version: chain.USDC.Version, ChainID: chain.ChainID, Contract: chain.USDC.Address}
}

type auth struct {
	From, To                       common.Address
	Value, ValidAfter, ValidBefore *big.Int
	Nonce                          [32]byte
}

// sign signs a with go-ethereum's generic EIP-712 code, independent of verify's own digest.
func sign(t testing.TB, key *ecdsa.PrivateKey, d domain, a auth) []byte {
	t.Helper()
	td := apitypes.TypedData{
		Types: apitypes.Types{
			"EIP712Domain": {{Name: "name", Type: "string"}, {Name: "version", Type: "string"},
				{Name: "chainId", Type: "uint256"}, {Name: "verifyingContract", Type: "address"}},
			"TransferWithAuthorization": {{Name: "from", Type: "address"}, {Name: "to", Type: "address"},
				{Name: "value", Type: "uint256"}, {Name: "validAfter", Type: "uint256"},
				{Name: "validBefore", Type: "uint256"}, {Name: "nonce", Type: "bytes32"}},
		},
		PrimaryType: "TransferWithAuthorization",
		Domain: apitypes.TypedDataDomain{Name: d.Name, Version: d.Version,
			ChainId: (*math.HexOrDecimal256)(new(big.Int).SetUint64(d.ChainID)), VerifyingContract: d.Contract.Hex()},
		Message: apitypes.TypedDataMessage{"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value,
			"validAfter": a.ValidAfter, "validBefore": a.ValidBefore, "nonce": a.Nonce[:]},
	}
	digest, _, err := apitypes.TypedDataAndHash(td)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := crypto.Sign(digest, key)
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	return sig
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func randomNonce(t testing.TB) [32]byte {
	var n [32]byte
	if _, err := rand.Read(n[:]); err != nil {
		t.Fatal(err)
	}
	return n
}

func randomAddress(t testing.TB) common.Address {
	return crypto.PubkeyToAddress(newKey(t).PublicKey)
}
