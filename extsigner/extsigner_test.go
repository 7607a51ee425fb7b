package extsigner_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

var (
	token  = common.HexToAddress("0x244ae02008762968261615a485542a9c7512c562")
	policy = extsigner.Policy{ChainID: 31337, Token: token, TokenName: "USD Coin", TokenVersion: "2", MaxGas: 200_000, MaxFeeCap: big.NewInt(100e9)}
	// payerKey signs the tests' authorizations.
	payerKey, _ = crypto.HexToECDSA("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
)

// authorization is the payer's authorization with nonce n.
func authorization(n byte) facilitator.Authorization {
	return facilitator.Authorization{From: crypto.PubkeyToAddress(payerKey.PublicKey), To: common.HexToAddress("0x02"), Value: big.NewInt(10),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(4102444800), Nonce: [32]byte{n}}
}

// signAuthorization is key's EIP-712 signature of a in the policy's token domain (v 27 or 28).
func signAuthorization(key *ecdsa.PrivateKey, a facilitator.Authorization) []byte {
	digest := eip3009.AuthorizationDigest(eip3009.DomainSeparator(policy.TokenName, policy.TokenVersion, policy.ChainID, policy.Token), a)
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		panic(err) // only for a key that is not one
	}
	sig[64] += 27
	return sig
}

// transferDataN is the calldata of the payer's signed authorization with nonce n.
func transferDataN(n byte) []byte {
	a := authorization(n)
	return eip3009.TransferCalldata(a, signAuthorization(payerKey, a))
}

func transferData() []byte { return transferDataN(0) }

// settlement is the transaction the engine asks for: a type-2 transferWithAuthorization.
func settlement() *types.DynamicFeeTx {
	return &types.DynamicFeeTx{Nonce: 7, GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(50e9), Gas: 120_000, To: &token, Data: transferData()}
}

func argsOf(tx *types.DynamicFeeTx) apitypes.SendTxArgs {
	return extsigner.Args(common.HexToAddress("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"), big.NewInt(31337), tx)
}

func TestPolicyAccepts(t *testing.T) {
	args := argsOf(settlement())
	got, err := policy.Check(&args)
	if err != nil {
		t.Fatal(err)
	}
	tx := types.NewTx(got)
	if tx.Type() != types.DynamicFeeTxType || *tx.To() != token || tx.Nonce() != 7 || tx.Gas() != 120_000 || tx.GasFeeCap().Int64() != 50e9 ||
		tx.GasTipCap().Int64() != 1e9 || tx.ChainId().Int64() != 31337 || string(tx.Data()) != string(transferData()) {
		t.Fatalf("checked transaction %+v", tx)
	}
	// Legacy pricing, as a chain without EIP-1559 needs it.
	legacy := argsOf(settlement())
	legacy.MaxFeePerGas, legacy.MaxPriorityFeePerGas, legacy.GasPrice = nil, nil, (*hexutil.Big)(big.NewInt(30e9))
	got, err = policy.Check(&legacy)
	if err != nil {
		t.Fatal(err)
	}
	if tx := types.NewTx(got); tx.Type() != types.LegacyTxType || tx.GasPrice().Int64() != 30e9 {
		t.Fatalf("legacy transaction %+v", tx)
	}
}

func TestPolicyRefuses(t *testing.T) {
	other := common.HexToAddress("0xdead")
	for _, tc := range []struct {
		name string
		edit func(a *apitypes.SendTxArgs)
		want string
	}{
		{"wrong to", func(a *apitypes.SendTxArgs) { m := common.NewMixedcaseAddress(other); a.To = &m }, "is not the token"},
		{"deployment", func(a *apitypes.SendTxArgs) { a.To = nil }, "deployment"},
		{"wrong selector (an ERC-20 transfer)", func(a *apitypes.SendTxArgs) {
			d := hexutil.Bytes(append(common.FromHex("0xa9059cbb"), make([]byte, 64)...))
			a.Input = &d
		}, "not a transferWithAuthorization"},
		{"cancelAuthorization", func(a *apitypes.SendTxArgs) {
			d := hexutil.Bytes(eip3009.CancelCalldata(other, [32]byte{1}, make([]byte, 65)))
			a.Input = &d
		}, "not a transferWithAuthorization"},
		{"no calldata", func(a *apitypes.SendTxArgs) { a.Input = nil }, "no calldata"},
		{"data differs from input", func(a *apitypes.SendTxArgs) { d := hexutil.Bytes{1, 2, 3, 4}; a.Data = &d }, "differ"},
		{"value", func(a *apitypes.SendTxArgs) { a.Value = hexutil.Big(*big.NewInt(1)) }, "value 1 wei is not zero"},
		{"fee over cap", func(a *apitypes.SendTxArgs) { a.MaxFeePerGas = (*hexutil.Big)(big.NewInt(100e9 + 1)) }, "over the ceiling"},
		{"legacy gas price over cap", func(a *apitypes.SendTxArgs) {
			a.MaxFeePerGas, a.MaxPriorityFeePerGas, a.GasPrice = nil, nil, (*hexutil.Big)(big.NewInt(100e9+1))
		}, "over the ceiling"},
		{"tip over fee cap", func(a *apitypes.SendTxArgs) { a.MaxPriorityFeePerGas = (*hexutil.Big)(big.NewInt(51e9)) }, "maxPriorityFeePerGas"},
		{"both pricings", func(a *apitypes.SendTxArgs) { a.GasPrice = (*hexutil.Big)(big.NewInt(1)) }, "either"},
		{"gas over cap", func(a *apitypes.SendTxArgs) { a.Gas = 200_001 }, "gas 200001"},
		{"wrong chain", func(a *apitypes.SendTxArgs) { a.ChainID = (*hexutil.Big)(big.NewInt(1)) }, "chainId 1"},
		{"no chain", func(a *apitypes.SendTxArgs) { a.ChainID = nil }, "no chainId"},
		{"access list", func(a *apitypes.SendTxArgs) { a.AccessList = &types.AccessList{{Address: other}} }, "type 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := argsOf(settlement())
			tc.edit(&args)
			_, err := policy.Check(&args)
			if !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a refusal saying %q, got %v", tc.want, err)
			}
		})
	}
}

// newServer is a narrow signer of one new key under the tests' policy, and its JSON-RPC handler.
func newServer(t *testing.T) (common.Address, http.Handler) {
	t.Helper()
	key, _ := crypto.GenerateKey()
	addr := crypto.PubkeyToAddress(key.PublicKey)
	srv, err := extsigner.NewServer(policy, []*ecdsa.PrivateKey{key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := srv.Handler()
	if err != nil {
		t.Fatal(err)
	}
	return addr, h
}

// TestServerOverHTTP: the client and the narrow signer over JSON-RPC: account_list names the
// key, a settlement comes back signed by it exactly as asked, and refusals (policy, unknown
// account) come back as errors that say why.
func TestServerOverHTTP(t *testing.T) {
	addr, h := newServer(t)
	hs := httptest.NewServer(h)
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := extsigner.Dial(ctx, hs.URL, policy.ChainID)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	accounts, err := ep.Accounts(ctx)
	if err != nil || len(accounts) != 1 || accounts[0] != addr {
		t.Fatalf("account_list: %v %v", accounts, err)
	}

	want := settlement()
	tx, err := ep.Signer(addr).SignTx(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	from, err := types.Sender(types.LatestSignerForChainID(big.NewInt(31337)), tx)
	if err != nil || from != addr {
		t.Fatalf("signed by %s (%v), want %s", from, err, addr)
	}
	if tx.Nonce() != want.Nonce || *tx.To() != token || tx.Gas() != want.Gas || tx.GasFeeCap().Cmp(want.GasFeeCap) != 0 || string(tx.Data()) != string(want.Data) {
		t.Fatalf("signed %+v, asked %+v", tx, want)
	}

	bad := settlement()
	bad.GasFeeCap = big.NewInt(101e9)
	if _, err := ep.Signer(addr).SignTx(ctx, bad); err == nil || !strings.Contains(err.Error(), "over the ceiling") {
		t.Fatalf("fee over the ceiling: %v", err)
	}
	if _, err := ep.Signer(common.HexToAddress("0xbeef")).SignTx(ctx, settlement()); err == nil || !strings.Contains(err.Error(), "not an account of this signer") {
		t.Fatalf("unknown account: %v", err)
	}
}

// TestClientErrorsHideCredentials: a signer URL's user, password, path and query never appear in
// an error (they can carry an API key).
func TestClientErrorsHideCredentials(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	raw := "http://operator:s3cr3tpw@" + addr + "/key/APIKEY123?token=QUERYSECRET"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, err := extsigner.Dial(ctx, raw, 31337)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	_, err = ep.Signer(common.HexToAddress("0x01")).SignTx(ctx, settlement())
	if err == nil {
		t.Fatal("signing through a signer that is down succeeded")
	}
	for _, secret := range []string{"operator", "s3cr3tpw", "APIKEY123", "QUERYSECRET"} {
		if strings.Contains(err.Error(), secret) || strings.Contains(ep.String(), secret) {
			t.Fatalf("%q leaks into %q / %q", secret, err, ep)
		}
	}
	if !strings.Contains(err.Error(), addr) {
		t.Fatalf("the error %q should say which signer (its host)", err)
	}
	if _, err := extsigner.Dial(ctx, "ftp://operator:s3cr3tpw@host/", 1); err == nil || strings.Contains(err.Error(), "s3cr3tpw") {
		t.Fatalf("a non-http URL: %v", err)
	}
}

// TestServerPassword: with a password, the narrow signer answers only requests carrying it (HTTP
// basic auth, as a client URL with user:password sends it); without or with a wrong one it signs
// nothing, and the client's error does not repeat the password.
func TestServerPassword(t *testing.T) {
	addr, h := newServer(t)
	hs := httptest.NewServer(extsigner.RequirePassword(h, "s3cret-PW"))
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	withPassword := func(pw string) string {
		if pw == "" {
			return hs.URL
		}
		return strings.Replace(hs.URL, "http://", "http://facilitator:"+pw+"@", 1)
	}
	for _, pw := range []string{"", "wrong-PW"} {
		ep, err := extsigner.Dial(ctx, withPassword(pw), policy.ChainID)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ep.Signer(addr).SignTx(ctx, settlement())
		ep.Close()
		if err == nil || (pw != "" && strings.Contains(err.Error(), pw)) {
			t.Fatalf("password %q: %v; want a refusal that does not repeat it", pw, err)
		}
	}
	ep, err := extsigner.Dial(ctx, withPassword("s3cret-PW"), policy.ChainID)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if _, err := ep.Signer(addr).SignTx(ctx, settlement()); err != nil {
		t.Fatalf("with the password: %v", err)
	}
}
