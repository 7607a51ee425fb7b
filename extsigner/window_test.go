package extsigner_test

import (
	"crypto/ecdsa"
	"encoding/hex"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/extsigner"
)

// clock is a test's clock, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// windowServer is a narrow signer of one new key under the tests' policy with window w, on c.
func windowServer(t *testing.T, w extsigner.Window, c *clock) (*extsigner.Server, common.Address, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := crypto.GenerateKey()
	p := policy
	p.Window = w
	srv, err := extsigner.NewServer(p, []*ecdsa.PrivateKey{key}, nil, extsigner.WithClock(c.now))
	if err != nil {
		t.Fatal(err)
	}
	return srv, crypto.PubkeyToAddress(key.PublicKey), key
}

// sign asks srv to sign a settlement from from at nonce with gas and fee cap feeGwei.
func sign(srv *extsigner.Server, from common.Address, nonce, gas uint64, feeGwei int64) error {
	tx := settlement()
	tx.Nonce, tx.Gas, tx.GasFeeCap = nonce, gas, big.NewInt(feeGwei*1e9)
	args := extsigner.Args(from, big.NewInt(31337), tx)
	_, err := srv.Sign(&args)
	return err
}

func refusedSaying(t *testing.T, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, extsigner.ErrRefused) {
		t.Fatalf("want a refusal, got %v", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("the refusal %q does not say %q", err, w)
		}
	}
}

// TestWindowBoundsTransactions: within a period the signer signs at most MaxTxs transactions
// (distinct account nonces); more are refused saying which bound and when there is room again.
// Variants at a nonce already counted (fee bumps) are signed and count once; once the period
// has passed since the first, the next is signed.
func TestWindowBoundsTransactions(t *testing.T) {
	c := &clock{time.Unix(1_800_000_000, 0)}
	srv, addr, key := windowServer(t, extsigner.Window{Period: time.Minute, MaxTxs: 3, MaxGas: 10_000_000}, c)
	for nonce := range uint64(3) {
		if err := sign(srv, addr, nonce, 120_000, 50); err != nil {
			t.Fatalf("nonce %d: %v", nonce, err)
		}
		c.t = c.t.Add(10 * time.Second)
	}
	err := sign(srv, addr, 3, 120_000, 50)
	refusedSaying(t, err, "3 transactions signed in the last 1m0s", "--max-txs-per-window", "room again in 30s")
	if k := hex.EncodeToString(crypto.FromECDSA(key)); strings.Contains(err.Error(), k) {
		t.Fatal("the refusal carries the key")
	}
	// A fee bump of nonce 2 is the same transaction: signed.
	if err := sign(srv, addr, 2, 120_000, 60); err != nil {
		t.Fatalf("a bump at a counted nonce: %v", err)
	}
	c.t = c.t.Add(30 * time.Second) // nonce 0 was signed 60 s ago
	if err := sign(srv, addr, 3, 120_000, 50); err != nil {
		t.Fatalf("once the first aged out: %v", err)
	}
	refusedSaying(t, sign(srv, addr, 4, 120_000, 50), "3 transactions")
}

// TestWindowBoundsGas: within a period the signer signs at most MaxGas gas (the sum of the
// transactions' limits; a variant with more gas at a counted nonce counts the difference), and
// never one transaction of more.
func TestWindowBoundsGas(t *testing.T) {
	c := &clock{time.Unix(1_800_000_000, 0)}
	srv, addr, _ := windowServer(t, extsigner.Window{Period: time.Hour, MaxTxs: 100, MaxGas: 300_000}, c)
	for nonce := range uint64(2) {
		if err := sign(srv, addr, nonce, 120_000, 50); err != nil {
			t.Fatalf("nonce %d: %v", nonce, err)
		}
		c.t = c.t.Add(time.Minute)
	}
	refusedSaying(t, sign(srv, addr, 2, 120_000, 50), "gas 120000 more would take the gas signed in the last 1h0m0s past 300000", "240000 signed",
		"--max-gas-per-window", "room again in 58m0s")
	if err := sign(srv, addr, 1, 180_000, 50); err != nil { // 60,000 more: 300,000
		t.Fatalf("a variant with more gas within the bound: %v", err)
	}
	refusedSaying(t, sign(srv, addr, 1, 180_001, 50), "gas 1 more")
	c.t = c.t.Add(59 * time.Minute) // nonce 0's 120,000 aged out
	if err := sign(srv, addr, 2, 120_000, 50); err != nil {
		t.Fatalf("once the first aged out: %v", err)
	}

	small, _, _ := windowServer(t, extsigner.Window{Period: time.Hour, MaxTxs: 100, MaxGas: 150_000}, c)
	refusedSaying(t, sign(small, small.Accounts()[0], 0, 150_001, 50), "gas 150001 is more than this signer signs per window, 150000")
}

// TestWindowDefaults: a policy without a window gets DefaultWindow, and a refusal by the policy
// counts nothing.
func TestWindowDefaults(t *testing.T) {
	c := &clock{time.Unix(1_800_000_000, 0)}
	srv, addr, _ := windowServer(t, extsigner.Window{}, c)
	if got := srv.Policy().Window; got != extsigner.DefaultWindow {
		t.Fatalf("window %+v, want %+v", got, extsigner.DefaultWindow)
	}
	srv, addr, _ = windowServer(t, extsigner.Window{Period: time.Hour, MaxTxs: 1}, c)
	refusedSaying(t, sign(srv, addr, 0, 120_000, 101), "over the ceiling")
	if err := sign(srv, addr, 0, 120_000, 50); err != nil {
		t.Fatalf("after a policy refusal: %v", err)
	}
}
