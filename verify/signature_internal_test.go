package verify

import (
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// TestRecoverEOA: the signer's address is recovered for v in {0, 1, 27, 28}; another signer, a
// flipped bit, a bad v, a short signature or an s of zero are refused.
func TestRecoverEOA(t *testing.T) {
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := crypto.GenerateKey()
	signer := crypto.PubkeyToAddress(key.PublicKey)
	for i := range 20 {
		digest := crypto.Keccak256Hash([]byte{byte(i)})
		sig, err := crypto.Sign(digest[:], key)
		if err != nil {
			t.Fatal(err)
		}
		with := func(v byte) []byte { s := append([]byte(nil), sig...); s[64] = v; return s }
		if !recoverEOA(digest, sig, signer) || !recoverEOA(digest, with(sig[64]+27), signer) {
			t.Fatalf("digest %d: the signer was not recovered", i)
		}
		if recoverEOA(digest, sig, crypto.PubkeyToAddress(other.PublicKey)) {
			t.Fatalf("digest %d: accepted for another address", i)
		}
		if recoverEOA(digest, with(1-sig[64]), signer) || recoverEOA(digest, with(29), signer) || recoverEOA(digest, with(2), signer) {
			t.Fatalf("digest %d: a wrong v recovered the signer", i)
		}
		flipped := append([]byte(nil), sig...)
		flipped[10] ^= 1
		if recoverEOA(digest, flipped, signer) {
			t.Fatalf("digest %d: a changed r recovered the signer", i)
		}
		if recoverEOA(digest, sig[:64], signer) {
			t.Fatalf("digest %d: a 64-byte signature was accepted", i)
		}
		zeroS := append([]byte(nil), sig...)
		clear(zeroS[32:64])
		if recoverEOA(digest, zeroS, common.Address{}) || recoverEOA(digest, zeroS, signer) {
			t.Fatalf("digest %d: s = 0 was accepted", i)
		}
	}
}

// BenchmarkRecoverEOA: the one signature recovery of every /verify (cgo libsecp256k1), and what
// goes around it.
func BenchmarkRecoverEOA(b *testing.B) {
	key, _ := crypto.GenerateKey()
	digest := crypto.Keccak256Hash([]byte("x"))
	sig, _ := crypto.Sign(digest[:], key)
	signer := crypto.PubkeyToAddress(key.PublicKey)
	b.ReportAllocs()
	for range b.N {
		if !recoverEOA(digest, sig, signer) {
			b.Fatal("not recovered")
		}
	}
}
