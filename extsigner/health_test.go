package extsigner_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestProbe: a probe tells a signer that holds the key and signs for the chain from one that is
// down, holds another key, signs for another chain or wants a password; the narrow signer signs
// nothing for it. Each answer, and each signature the engine asks for, is recorded in the key's
// health: up, last signature, refusals by reason.
func TestProbe(t *testing.T) {
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	addr := crypto.PubkeyToAddress(key.PublicKey)
	serve := func(t *testing.T, chainID uint64, password string) string {
		p := policy
		p.ChainID = chainID
		srv, err := extsigner.NewServer(p, []*ecdsa.PrivateKey{key}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h, err := srv.Handler()
		if err != nil {
			t.Fatal(err)
		}
		if password != "" {
			h = extsigner.RequirePassword(h, password)
		}
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		return hs.URL
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()

	good := serve(t, 31337, "")
	for _, c := range []struct {
		name, url string
		addr      common.Address
		reason    string
	}{
		{"holds the key, signs for the chain", good, addr, ""},
		{"down", closed, addr, extsigner.ReasonUnreachable},
		{"another key", good, common.HexToAddress("0x42"), extsigner.ReasonUnknownKey},
		{"another chain", serve(t, 4242, ""), addr, extsigner.ReasonWrongChain},
		{"a password not given", serve(t, 31337, "pw"), addr, extsigner.ReasonUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := probeWants(t, 5*time.Second, c.url, 31337, c.addr, c.reason)
			h := ep.Health()
			if len(h) != 1 || !h[0].Known || h[0].Up != (c.reason == "") || h[0].Address != c.addr {
				t.Fatalf("health after the probe: %+v", h)
			}
			if !h[0].LastSigned.IsZero() || h[0].Refusals[extsigner.ReasonUnreachable] != 0 {
				t.Fatalf("a probe counted as a signature or a refusal: %+v", h[0])
			}
		})
	}

	// The engine's signatures: one signed, then the signer goes away.
	ctx := context.Background()
	ep, err := extsigner.Dial(ctx, good, 31337)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	c := ep.Signer(addr)
	if h := ep.Health(); len(h) != 1 || h[0].Known {
		t.Fatalf("a key not contacted yet: %+v", h)
	}
	if _, err := c.SignTx(ctx, settlement()); err != nil {
		t.Fatal(err)
	}
	h := ep.Health()[0]
	if !h.Up || h.LastSigned.IsZero() || h.State != "ok" {
		t.Fatalf("after a signature: %+v", h)
	}
	forged := settlement()
	forged.Data = append([]byte{}, forged.Data...)
	forged.Data[len(forged.Data)-40] ^= 1 // the payer's signature no longer recovers
	if _, err := c.SignTx(ctx, forged); err == nil {
		t.Fatal("a forged authorization was signed")
	}
	h = ep.Health()[0]
	if !h.Up || h.Refusals[extsigner.ReasonRefused] != 1 || !strings.Contains(h.State, "refused") {
		t.Fatalf("after a refusal by policy, the signer is up and the refusal counted: %+v", h)
	}
	down, err := extsigner.Dial(ctx, closed, 31337)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	if _, err := down.Signer(addr).SignTx(ctx, settlement()); err == nil {
		t.Fatal("signed through a closed port")
	}
	if h := down.Health()[0]; h.Up || h.Refusals[extsigner.ReasonUnreachable] != 1 || !h.LastSigned.IsZero() {
		t.Fatalf("after an unreachable signer: %+v", h)
	}
}

// TestProbeClef: the same probe tells a Clef (whose rules here approve everything, so it signs
// the probe, which can never be mined) that holds the key for the chain from one asked for
// another chain or another key.
func TestProbeClef(t *testing.T) {
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	addr := crypto.PubkeyToAddress(key.PublicKey)
	clef := stacktest.StartClef(t, 31337, key)
	for _, c := range []struct {
		name    string
		chainID uint64
		addr    common.Address
		reason  string
	}{
		{"holds the key, signs for the chain", 31337, addr, ""},
		{"another chain", 4242, addr, extsigner.ReasonWrongChain},
		{"another key", 31337, common.HexToAddress("0x42"), extsigner.ReasonUnknownKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			probeWants(t, 20*time.Second, clef.URL, c.chainID, c.addr, c.reason)
		})
	}
}

// probeWants dials the signer at url for chainID, probes addr within timeout and fails the test
// unless the probe ends with reason ("": success). The endpoint is closed when the test ends.
func probeWants(t *testing.T, timeout time.Duration, url string, chainID uint64, addr common.Address, reason string) *extsigner.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ep, err := extsigner.Dial(ctx, url, chainID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	err = ep.Probe(ctx, addr)
	var se *extsigner.SignError
	switch {
	case reason == "" && err != nil:
		t.Fatalf("probe: %v", err)
	case reason != "" && (!errors.As(err, &se) || se.Reason != reason):
		t.Fatalf("probe: %v, want reason %s", err, reason)
	}
	return ep
}
