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

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/migrations"

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
	editNetwork := func(env map[string]string, f func(n map[string]any)) {
		var nets []map[string]any
		if err := json.Unmarshal([]byte(env["FACILITATOR_NETWORKS"]), &nets); err != nil {
			t.Fatal(err)
		}
		f(nets[0])
		b, _ := json.Marshal(nets)
		env["FACILITATOR_NETWORKS"] = string(b)
	}
	// anvil serves WebSocket on its HTTP port.
	wsURL := "ws://" + strings.TrimPrefix(chain.RPCURL, "http://")
	check := func(edit func(env map[string]string)) (string, int) {
		t.Helper()
		env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
		env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
		editNetwork(env, func(n map[string]any) { n["ws"] = wsURL })
		edit(env)
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"serve", "--check-config"}, func(k string) string { return env[k] }, &out, &errOut)
		return out.String() + errOut.String(), code
	}

	out, code := check(func(map[string]string) {})
	if code != 0 || !strings.Contains(out, "the configuration is ready to serve") || strings.Contains(out, "FAIL") {
		t.Fatalf("a good configuration: exit %d\n%s", code, out)
	}
	for _, want := range []string{"WebSocket ws0 serves chain 31337 and new heads", "fees: no max fee", `--reconcile-schedule "@every 30s" is a cron schedule`,
		"listen address 127.0.0.1:0 can be bound"} {
		if !strings.Contains(out, "ok    eip155:31337: "+want) && !strings.Contains(out, "ok    "+want) {
			t.Fatalf("a good configuration: no line %q\n%s", want, out)
		}
	}
	out, code = check(func(env map[string]string) {
		editNetwork(env, func(n map[string]any) { n["fees"] = map[string]any{"maxFeeGwei": 1000} })
	})
	if code != 0 || !strings.Contains(out, "ok    eip155:31337: fees: max fee 1000 gwei, and the chain needs a fee cap of ") {
		t.Fatalf("a max fee above the chain's fees: exit %d\n%s", code, out)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	deadWS, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadWSURL := "ws://" + deadWS.Addr().String() + "/secret-ws-key"
	deadWS.Close()
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
	out, code = check(func(env map[string]string) {
		env["FACILITATOR_SIGNER_KEYS"] += ",0x" + strings.Repeat("42", 32)
		env["FACILITATOR_SIGNER_MIN_BALANCE_WEI"] = "0"
		env["FACILITATOR_RETIRE_SIGNERS"] = keyAddr.Hex()
	})
	if !strings.Contains(out, "ok    eip155:31337: signer "+keyAddr.Hex()+" funded for gas (retiring: it takes no new settlement") ||
		!strings.Contains(out, "ok    eip155:31337: a signer key that is not retiring") || !strings.Contains(out, "ok    --retire-signers "+keyAddr.Hex()+" is a signer key") {
		t.Fatalf("retiring one of two keys: exit %d\n%s", code, out)
	}
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
		{"a max fee below the chain's fees", "is below the fee cap the chain needs now", func(env map[string]string) {
			editNetwork(env, func(n map[string]any) { n["fees"] = map[string]any{"maxFeeGwei": 0.000000001} })
		}},
		{"a max fee flag below the chain's fees", "the max fee, 0.000000001 gwei, is below the fee cap the chain needs now", func(env map[string]string) {
			env["FACILITATOR_MAX_FEE_GWEI"] = "0.000000001"
		}},
		{"a schedule that is not cron's", `--reconcile-schedule "every 30s" is a cron schedule: `, func(env map[string]string) {
			env["FACILITATOR_RECONCILE_SCHEDULE"] = "every 30s"
		}},
		{"a listen address taken", "address already in use; fix: stop what holds it, or choose another --listen", func(env map[string]string) {
			env["FACILITATOR_LISTEN"] = taken.Addr().String()
		}},
		{"a WebSocket that does not answer", "WebSocket ws0 serves chain 31337 and new heads: dialing: ", func(env map[string]string) {
			editNetwork(env, func(n map[string]any) { n["ws"] = deadWSURL })
		}},
		{"keys mode without a schema", "no API key: the database has no schema yet", func(env map[string]string) {
			env["FACILITATOR_AUTH"] = "keys"
		}},
		{"every signer key retiring", "a signer key that is not retiring: every signer key of the network is in --retire-signers: every /settle would answer 503 signers_retiring; fix: add the new key", func(env map[string]string) {
			env["FACILITATOR_RETIRE_SIGNERS"] = keyAddr.Hex()
		}},
		{"retiring an address that is no signer", "--retire-signers 0x0000000000000000000000000000000000000042 is a signer key: it is not a signer key of any network", func(env map[string]string) {
			env["FACILITATOR_RETIRE_SIGNERS"] = "0x0000000000000000000000000000000000000042"
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
			if strings.Contains(out, other.RPCURL) || strings.Contains(out, chain.RPCURL) || strings.Contains(out, "secret-ws-key") {
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

// TestCheckConfigAPIKeys: in keys mode (serve's default), --check-config fails until the database
// holds a key that is not revoked, and names the command that creates one.
func TestCheckConfigAPIKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, chain := requireStack(t)
	dbURL := stacktest.NewDB(t, "cmdkeys")
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_AUTH"] = "keys"
	getenv := func(k string) string { return env[k] }
	check := func() (string, int) {
		var out bytes.Buffer
		code := run(ctx, []string{"serve", "--check-config"}, getenv, &out, &out)
		return out.String(), code
	}
	out, code := check()
	if code == 0 || !strings.Contains(out, "FAIL  API keys: at least one merchant key (--auth keys): no API key that is not revoked (0 revoked)") ||
		!strings.Contains(out, "fix: create one, `facilitator keys create") {
		t.Fatalf("keys mode without a key: exit %d\n%s", code, out)
	}
	var created bytes.Buffer
	if code := run(ctx, []string{"keys", "create", "--name", "m", "--scopes", "verify"}, getenv, &created, &created); code != 0 {
		t.Fatalf("keys create: %d %s", code, created.String())
	}
	if out, code := check(); code != 0 || !strings.Contains(out, "ok    API keys: at least one merchant key") {
		t.Fatalf("keys mode with a key: exit %d\n%s", code, out)
	}
	// A database a migration behind (here, before key rotation's columns: what serve applies at
	// start) still has its keys counted: the check reads no column a later migration adds.
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	down, err := migrations.FS.ReadFile("0022_key_rotation.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, string(down)); err != nil {
		t.Fatal(err)
	}
	if out, code := check(); code != 0 || !strings.Contains(out, "ok    API keys: at least one merchant key") {
		t.Fatalf("keys mode with a key, a migration behind: exit %d\n%s", code, out)
	}
}

// TestCheckConfigSilentEndpoint: an RPC endpoint that accepts connections and never answers is
// one failed check within --rpc-timeout, named rpc1 and never by its URL; the network's other
// endpoint carries the remaining checks. (It used to hang the check for two minutes.)
func TestCheckConfigSilentEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, chain := requireStack(t)
	hole, _ := blackhole(t)
	hole += "/v2/SECRETKEY"
	env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_RPC_TIMEOUT"] = "1s"
	env["FACILITATOR_NETWORKS"] = withRPCs(t, env["FACILITATOR_NETWORKS"], hole)
	var out bytes.Buffer
	began := time.Now()
	code := run(ctx, []string{"serve", "--check-config"}, func(k string) string { return env[k] }, &out, &out)
	took := time.Since(began)
	report := out.String()
	if took > 20*time.Second {
		t.Fatalf("the check took %s with --rpc-timeout 1s:\n%s", took, report)
	}
	if code == 0 || !strings.Contains(report, "FAIL  eip155:31337: RPC endpoint rpc1 answers: RPC endpoint rpc1: no answer within --rpc-timeout (1s)") ||
		!strings.Contains(report, "ok    eip155:31337: 2 RPC endpoint(s) serve chain 31337") ||
		!strings.Contains(report, "ok    eip155:31337: token "+chain.USDC.Address.Hex()) || strings.Contains(report, "SECRETKEY") {
		t.Fatalf("exit %d after %s:\n%s", code, took, report)
	}
}

// TestCheckConfigGenesis: a node that answers a preset's chain id with another chain's genesis
// (here an anvil started as chain 84532, Base Sepolia's id) is a red line naming Base Sepolia's
// genesis and the fix; and a ledger bound to another genesis than the endpoint's (a dev chain
// restarted from genesis), on which serve would refuse to start, is one too. Nothing is bound.
func TestCheckConfigGenesis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, chain := requireStack(t)
	check := func(env map[string]string) (string, int) {
		t.Helper()
		env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
		var out bytes.Buffer
		code := run(ctx, []string{"serve", "--check-config"}, func(k string) string { return env[k] }, &out, &out)
		return out.String(), code
	}

	sepolia, _ := chains.Lookup("base-sepolia")
	fake := stacktest.NewChain(t, devchain.Options{ChainID: sepolia.ChainID})
	out, code := check(serveEnv(t, stacktest.NewDB(t, "cmdgenesis"), fake, fake.RPCURL, fake.Accounts[0].Key))
	want := "FAIL  eip155:84532: genesis 0x"
	fix := "not Base Sepolia's " + sepolia.Genesis.Hex() + " (chain 84532): point the network's RPC at a Base Sepolia node"
	if code == 0 || !strings.Contains(out, want) || !strings.Contains(out, fix) {
		t.Fatalf("an anvil claiming Base Sepolia's chain id: exit %d, want %q ... %q:\n%s", code, want, fix, out)
	}

	dbURL := stacktest.NewDB(t, "cmdbinding")
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
	if out, _ = check(env); !strings.Contains(out, "ok    eip155:31337: the ledger is not bound to a chain yet: serve binds it to genesis 0x") {
		t.Fatalf("a fresh database:\n%s", out)
	}
	if strings.Contains(out, "is anvil") {
		t.Fatalf("a genesis line for a preset that knows none:\n%s", out)
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	old := common.HexToHash("0x01")
	if err := db.BindNetwork(ctx, "eip155:31337", chain.ChainID, old); err != nil {
		t.Fatal(err)
	}
	out, code = check(env)
	if code == 0 || !strings.Contains(out, "FAIL  eip155:31337: the ledger's chain: the ledger is bound to chain 31337 with genesis "+old.Hex()) ||
		!strings.Contains(out, "fix: point the network's RPC at the chain the ledger was written against") {
		t.Fatalf("a ledger bound to another genesis: exit %d\n%s", code, out)
	}
	if _, g, err := db.NetworkBinding(ctx, "eip155:31337"); err != nil || g != old {
		t.Fatalf("the check changed the binding: %s, %v", g, err)
	}
}
