package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"math/big"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/extsigner"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestCheckConfig: serve --check-config reports each check against the real dependencies and
// exits non-zero on any problem, writing nothing: a good configuration passes; a second RPC
// endpoint on another chain, a token domain the contract does not have, and a signer key with no
// gas each fail by name.
func TestCheckConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, chain := requireStack(t)
	other := stacktest.NewChain(t, devchain.Options{ChainID: 4242})
	check := func(edit func(env map[string]string)) (string, int) {
		t.Helper()
		env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
		edit(env)
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"serve", "--check-config"}, func(k string) string { return env[k] }, &out, &errOut)
		return out.String() + errOut.String(), code
	}
	editNetwork := func(env map[string]string, f func(n map[string]any)) {
		var nets []map[string]any
		if err := json.Unmarshal([]byte(env["FACILITATOR_NETWORKS"]), &nets); err != nil {
			t.Fatal(err)
		}
		f(nets[0])
		b, _ := json.Marshal(nets)
		env["FACILITATOR_NETWORKS"] = string(b)
	}

	out, code := check(func(map[string]string) {})
	if code != 0 || !strings.Contains(out, "the configuration is ready to serve") || strings.Contains(out, "FAIL") {
		t.Fatalf("a good configuration: exit %d\n%s", code, out)
	}
	// The key in a narrow signer of the chain's; and in one of another chain's.
	key := chain.Accounts[0].Key
	narrow := func(chainID uint64) string {
		srv, err := extsigner.NewServer(extsigner.Policy{ChainID: chainID, Token: chain.USDC.Address, TokenName: chain.USDC.Name,
			TokenVersion: chain.USDC.Version, MaxGas: 300_000, MaxFeeCap: big.NewInt(1e12)}, []*ecdsa.PrivateKey{key}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h, err := srv.Handler()
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		return "clef:" + hs.URL + "/"
	}
	goodSigner, otherChainSigner := narrow(chain.ChainID), narrow(4242)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downSigner := "clef:http://" + l.Addr().String() + "/"
	l.Close()
	remote := func(spec string, addr common.Address) func(env map[string]string) {
		return func(env map[string]string) {
			delete(env, "FACILITATOR_SIGNER_KEYS")
			env["FACILITATOR_SIGNER"] = spec
			env["FACILITATOR_SIGNER_ADDRESSES"] = addr.Hex()
		}
	}
	keyAddr := crypto.PubkeyToAddress(key.PublicKey)
	out, code = check(remote(goodSigner, keyAddr))
	if code != 0 || strings.Contains(out, "FAIL") || !strings.Contains(out, "holds "+keyAddr.Hex()+" and signs for chain 31337") {
		t.Fatalf("a remote signer holding the key for the chain: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		name, want string
		edit       func(env map[string]string)
	}{
		{"an endpoint on another chain", "RPC endpoint rpc1: eip155:31337: the RPC serves chain 4242", func(env map[string]string) {
			editNetwork(env, func(n map[string]any) { n["rpcs"] = []string{other.RPCURL} })
		}},
		{"a token domain the contract does not have", `name "USD Coin!" is configured`, func(env map[string]string) {
			editNetwork(env, func(n map[string]any) {
				n["tokens"] = []map[string]string{{"address": chain.USDC.Address.Hex(), "name": "USD Coin!", "version": chain.USDC.Version}}
			})
		}},
		{"a signer without gas", "holds no native token", func(env map[string]string) {
			env["FACILITATOR_SIGNER_KEYS"] = "0x" + strings.Repeat("42", 32)
			env["FACILITATOR_SIGNER_MIN_BALANCE_WEI"] = "0"
		}},
		{"a remote signer that is down", "connection refused; fix: start the signer", remote(downSigner, keyAddr)},
		{"a remote signer without the key", "is not an account of this signer; fix: put the key in the signer", remote(goodSigner, common.HexToAddress("0x42"))},
		{"a remote signer of another chain", "is not this signer's chain 4242; fix: run the signer for chain 31337", remote(otherChainSigner, keyAddr)},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := check(c.edit)
			if code == 0 || !strings.Contains(out, "FAIL") || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want a failure naming %q:\n%s", code, c.want, out)
			}
			if strings.Contains(out, other.RPCURL) || strings.Contains(out, chain.RPCURL) {
				t.Fatalf("the report carries an RPC URL:\n%s", out)
			}
		})
	}
	// Nothing was written: the check binds no network and applies no migration.
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("the check left %d tables in a fresh database", tables)
	}
}
