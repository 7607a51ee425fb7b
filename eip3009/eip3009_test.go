package eip3009_test

import (
	"bytes"
	"math/big"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/math"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

func authorization() facilitator.Authorization {
	return facilitator.Authorization{From: common.Address{1}, To: common.Address{2}, Value: big.NewInt(1000),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1_900_000_000), Nonce: [32]byte{3}}
}

// The hand-built digest is go-ethereum's generic EIP-712 digest of the same typed data.
func TestAuthorizationDigestMatchesTypedData(t *testing.T) {
	a := authorization()
	token := common.HexToAddress("0x036CbD53842c5426634e7929541eC2318f3dCF7e")
	td := apitypes.TypedData{
		Types: apitypes.Types{
			"EIP712Domain": {{Name: "name", Type: "string"}, {Name: "version", Type: "string"},
				{Name: "chainId", Type: "uint256"}, {Name: "verifyingContract", Type: "address"}},
			"TransferWithAuthorization": {{Name: "from", Type: "address"}, {Name: "to", Type: "address"},
				{Name: "value", Type: "uint256"}, {Name: "validAfter", Type: "uint256"},
				{Name: "validBefore", Type: "uint256"}, {Name: "nonce", Type: "bytes32"}},
		},
		PrimaryType: "TransferWithAuthorization",
		Domain: apitypes.TypedDataDomain{Name: "USDC", Version: "2",
			ChainId: (*math.HexOrDecimal256)(big.NewInt(84532)), VerifyingContract: token.Hex()},
		Message: apitypes.TypedDataMessage{"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value,
			"validAfter": a.ValidAfter, "validBefore": a.ValidBefore, "nonce": a.Nonce[:]},
	}
	want, _, err := apitypes.TypedDataAndHash(td)
	if err != nil {
		t.Fatal(err)
	}
	if got := eip3009.AuthorizationDigest(eip3009.DomainSeparator("USDC", "2", 84532, token), a); !bytes.Equal(got[:], want) {
		t.Fatalf("digest %x, want %x", got, want)
	}
}

// The hand-laid (v, r, s) calldata is abi.Pack's, for values up to 2^256-1 and every v.
func TestTransferCalldataMatchesPack(t *testing.T) {
	parsed, err := abi.JSON(strings.NewReader(`[{"type":"function","name":"transferWithAuthorization","inputs":[` +
		`{"type":"address"},{"type":"address"},{"type":"uint256"},{"type":"uint256"},{"type":"uint256"},` +
		`{"type":"bytes32"},{"type":"uint8"},{"type":"bytes32"},{"type":"bytes32"}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	maxU := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1))
	for i, value := range []*big.Int{big.NewInt(0), big.NewInt(10000), maxU} {
		a := authorization()
		a.Value, a.ValidAfter = value, new(big.Int).Rsh(maxU, uint(i*100))
		sig := make([]byte, 65)
		for j := range sig {
			sig[j] = byte(j*7 + i)
		}
		for _, v := range []byte{0, 1, 27, 28} {
			sig[64] = v
			got := eip3009.TransferCalldata(a, sig)
			var r, s [32]byte
			copy(r[:], sig[:32])
			copy(s[:], sig[32:64])
			want, err := parsed.Pack("transferWithAuthorization", a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, v%27+27, r, s)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("value %s v %d:\n got %x\nwant %x", value, v, got, want)
			}
		}
	}
}

// A 65-byte signature takes the (v, r, s) overload with v as 27/28; anything else the bytes
// overload; both decode back to the authorization.
func TestTransferCalldata(t *testing.T) {
	a := authorization()
	sig := make([]byte, 65)
	sig[0], sig[32], sig[64] = 7, 8, 1
	vrs := eip3009.TransferCalldata(a, sig)
	if !bytes.Equal(vrs[:4], common.FromHex("0xe3ee160e")) {
		t.Fatalf("(v, r, s) selector %x", vrs[:4])
	}
	if v := vrs[4+6*32+31]; v != 28 {
		t.Fatalf("v = %d, want 28", v)
	}
	wallet := eip3009.TransferCalldata(a, make([]byte, 97))
	if !bytes.Equal(wallet[:4], common.FromHex("0xcf092995")) {
		t.Fatalf("bytes selector %x", wallet[:4])
	}
	// The signature decodes as the token checks it: r, s, v with v normalised; the bytes as given.
	wantVRS := append([]byte(nil), sig...)
	wantVRS[64] = 28
	walletSig := make([]byte, 97)
	walletSig[96] = 5
	wallet = eip3009.TransferCalldata(a, walletSig)
	for data, want := range map[*[]byte][]byte{&vrs: wantVRS, &wallet: walletSig} {
		if c, ok := eip3009.DecodeCall(*data); !ok || !bytes.Equal(c.Signature, want) {
			t.Fatalf("the decoded signature %x, want %x", c.Signature, want)
		}
	}
	for _, data := range [][]byte{vrs, wallet} {
		c, ok := eip3009.DecodeCall(data)
		if !ok || c.Method != eip3009.MethodTransferWithAuthorization || c.Authorization.From != a.From || c.Authorization.To != a.To ||
			c.Authorization.Value.Cmp(a.Value) != 0 || c.Authorization.ValidBefore.Cmp(a.ValidBefore) != 0 || c.Authorization.Nonce != a.Nonce {
			t.Fatalf("decoded %+v %v", c, ok)
		}
	}
	if _, ok := eip3009.DecodeCall([]byte{1, 2, 3, 4}); ok {
		t.Fatal("an unknown selector decoded")
	}
}

func TestAnswers(t *testing.T) {
	out, err := eip3009.EncodeAnswer(eip3009.MethodAuthorizationState, true)
	if used, ok := eip3009.DecodeAuthorizationState(out); err != nil || !ok || !used {
		t.Fatalf("authorizationState: %v %v %v", used, ok, err)
	}
	out, err = eip3009.EncodeAnswer(eip3009.MethodBalanceOf, big.NewInt(42))
	if b, ok := eip3009.DecodeBalance(out); err != nil || !ok || b.Int64() != 42 {
		t.Fatalf("balanceOf: %v %v %v", b, ok, err)
	}
	out, err = eip3009.EncodeAnswer(eip3009.MethodName, "USD Coin")
	if s, ok := eip3009.DecodeString(out); err != nil || !ok || s != "USD Coin" {
		t.Fatalf("name: %q %v %v", s, ok, err)
	}
	if _, ok := eip3009.DecodeAuthorizationState([]byte{1}); ok {
		t.Fatal("a short answer decoded")
	}
}

// An ERC-6492 wrapper settles with its inner signature; a wrapper naming no factory, or no
// wrapper, is the signature itself.
func TestSettlementSignature(t *testing.T) {
	inner := bytes.Repeat([]byte{9}, 65)
	wrap := func(factory common.Address) []byte {
		addr, _ := abi.NewType("address", "", nil)
		byts, _ := abi.NewType("bytes", "", nil)
		enc, err := abi.Arguments{{Type: addr}, {Type: byts}, {Type: byts}}.Pack(factory, []byte{0xfa}, inner)
		if err != nil {
			t.Fatal(err)
		}
		return append(enc, common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")...)
	}
	w, ok := eip3009.Unwrap6492(wrap(common.Address{5}))
	if !ok || w.Factory != (common.Address{5}) || !bytes.Equal(w.FactoryData, []byte{0xfa}) || !bytes.Equal(w.Inner, inner) {
		t.Fatalf("unwrapped %+v %v", w, ok)
	}
	if got := eip3009.SettlementSignature(wrap(common.Address{5})); !bytes.Equal(got, inner) {
		t.Fatalf("settlement signature of a wrapper: %x", got)
	}
	zero := wrap(common.Address{})
	if got := eip3009.SettlementSignature(zero); !bytes.Equal(got, zero) {
		t.Fatal("a wrapper without a factory was unwrapped")
	}
	if got := eip3009.SettlementSignature(inner); !bytes.Equal(got, inner) {
		t.Fatal("a plain signature was changed")
	}
}

// The logs the simulator emits decode as the indexer reads them; malformed ones do not.
func TestEvents(t *testing.T) {
	token, from, to := common.Address{1}, common.Address{2}, common.Address{3}
	f, tt, v, ok := eip3009.DecodeTransfer(eip3009.TransferLog(token, from, to, big.NewInt(5)))
	if !ok || f != from || tt != to || v.Int64() != 5 {
		t.Fatalf("transfer: %v %v %v %v", f, tt, v, ok)
	}
	for _, canceled := range []bool{false, true} {
		l := eip3009.AuthorizationLog(token, from, [32]byte{4}, canceled)
		auth, nonce, c, ok := eip3009.DecodeAuthorization(l)
		if !ok || auth != from || nonce != [32]byte{4} || c != canceled {
			t.Fatalf("authorization log (canceled %v): %v %x %v %v", canceled, auth, nonce, c, ok)
		}
		if _, _, _, ok := eip3009.DecodeTransfer(l); ok {
			t.Fatal("an authorization log decoded as a transfer")
		}
	}
	short := eip3009.TransferLog(token, from, to, big.NewInt(5))
	short.Data = nil
	if _, _, _, ok := eip3009.DecodeTransfer(short); ok {
		t.Fatal("a Transfer without its value decoded")
	}
}

// BenchmarkVerifyEncoding: what verify encodes per payment besides the signature recovery (the
// domain, the digest, the simulation's calldata).
func BenchmarkVerifyEncoding(b *testing.B) {
	a := authorization()
	token := common.Address{9}
	sig := make([]byte, 65)
	b.ReportAllocs()
	for range b.N {
		eip3009.AuthorizationDigest(eip3009.DomainSeparator("USD Coin", "2", 84532, token), a)
		eip3009.TransferCalldata(a, sig)
	}
}
