package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// requireStack returns the test database URL and a fresh chain, or skips (fails under CI).
func requireStack(t *testing.T) (string, *devchain.Chain) {
	t.Helper()
	return stacktest.NewDB(t, "cmd"), stacktest.NewChain(t, devchain.Options{})
}

// serveConfig is serve's configuration from env, which must parse.
func serveConfig(t *testing.T, env map[string]string) *Config {
	t.Helper()
	cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startMain runs serve's wiring in this process with cfg, until ctx ends or the caller closes it.
func startMain(ctx context.Context, t *testing.T, cfg *Config, log *slog.Logger) *Main {
	t.Helper()
	m := &Main{Config: cfg, Logger: log}
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}

// configFor is serve's configuration for the in-process tests: serveEnv's, listening on port 0.
func configFor(t *testing.T, dbURL string, chain *devchain.Chain, key *ecdsa.PrivateKey) (*Config, error) {
	env := serveEnv(t, dbURL, chain, chain.RPCURL, key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	return parseServeFlags(nil, func(k string) string { return env[k] })
}

// TestServeEndToEnd runs the real wiring (Postgres, migrations, RPC checks, HTTP) and verifies a
// payment the way a merchant would.
func TestServeEndToEnd(t *testing.T) {
	dbURL, chain := requireStack(t)
	keyHex := "0x" + hex.EncodeToString(crypto.FromECDSA(chain.Accounts[0].Key))
	cfg, err := configFor(t, dbURL, chain, chain.Accounts[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	cfg.PublicReceipts = true // serve's default
	logs := &stacktest.SyncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := startMain(ctx, t, cfg, newLogger(logs, "debug", "json"))
	defer m.Close()
	base := "http://" + m.Addr

	res, err := http.Get(base + "/supported")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var sup facilitator.SupportedResponse
	if err := json.Unmarshal(body, &sup); err != nil {
		t.Fatal(err)
	}
	if len(sup.Kinds) != 1 || sup.Kinds[0].Network != "eip155:31337" || sup.Kinds[0].X402Version != 2 ||
		len(sup.Signers["eip155:*"]) != 1 || sup.Signers["eip155:*"][0] != chain.Accounts[0].Address.Hex() {
		t.Fatalf("supported: %s", body)
	}

	payer, nonce := chain.Accounts[1].Address, [32]byte{1, 2, 3}
	reqBody := paymentBody(t, chain, chain.Accounts[2].Address, nonce)
	res, err = http.Post(base+"/verify", "application/json", bytes.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"isValid":true`) {
		t.Fatalf("verify: %d %s", res.StatusCode, body)
	}

	// Settled, the payment's console page (as the binary wires it: the ledger, the chain, the
	// token's decimals from the configuration) says so.
	res, err = http.Post(base+"/settle", "application/json", bytes.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	settled, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(settled), `"success":true`) {
		t.Fatalf("settle: %d %s", res.StatusCode, settled)
	}
	res, err = http.Get(base + "/console/authorizations/eip155:31337/" + chain.USDC.Address.Hex() + "/" + payer.Hex() + "/0x" + hex.EncodeToString(nonce[:]))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(res.Header.Get("Content-Security-Policy"), "script-src 'self'") ||
		!strings.Contains(string(page), "0.01 USD Coin") || !strings.Contains(string(page), `id="state">settled`) {
		t.Fatalf("console page: %d %v\n%s", res.StatusCode, res.Header, page)
	}

	// What the merchant delivered, as the binary wires it (open mode: without a key), on the
	// authorization's status.
	var sr facilitator.SettleResponse
	if err := json.Unmarshal(settled, &sr); err != nil {
		t.Fatal(err)
	}
	digest := "0x" + strings.Repeat("ab", 32)
	res, err = http.Post(base+"/v1/settlements/"+sr.Transaction+"/delivery", "application/json", strings.NewReader(`{"sha256":"`+digest+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	recorded, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("delivery record: %d %s", res.StatusCode, recorded)
	}
	res, err = http.Get(base + "/v1/authorizations/eip155:31337/" + chain.USDC.Address.Hex() + "/" + payer.Hex() + "/0x" + hex.EncodeToString(nonce[:]))
	if err != nil {
		t.Fatal(err)
	}
	var st facilitator.AuthorizationStatus
	err = json.NewDecoder(res.Body).Decode(&st)
	res.Body.Close()
	if err != nil || st.Delivery == nil || st.Delivery.SHA256 != digest {
		t.Fatalf("the status after the delivery record: %+v, %v", st, err)
	}
	// The payer's receipt as the binary wires it: the page, and its JSON the public view.
	receipt := base + "/r/eip155:31337/" + chain.USDC.Address.Hex() + "/" + payer.Hex() + "/0x" + hex.EncodeToString(nonce[:])
	res, err = http.Get(receipt + ".json")
	if err != nil {
		t.Fatal(err)
	}
	rcJSON, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var rc facilitator.Receipt
	if err := json.Unmarshal(rcJSON, &rc); err != nil || res.StatusCode != 200 || rc.View != facilitator.ViewPublic || rc.State != facilitator.StatusSettled {
		t.Fatalf("receipt JSON: %d %s (%v)", res.StatusCode, rcJSON, err)
	}
	res, err = http.Get(receipt)
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(page), `id="state">settled by this facilitator`) || strings.Contains(string(page), "<script") {
		t.Fatalf("receipt page: %d\n%s", res.StatusCode, page)
	}

	// The operations overview as the binary wires it: the answer just given is counted, the
	// signer key is listed, and the ledger sections are read.
	res, err = http.Get(base + "/v1/ops/overview")
	if err != nil {
		t.Fatal(err)
	}
	overview, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var ov struct {
		Answers struct {
			VerifyTotal map[string]int `json:"verifyTotal"`
		} `json:"answers"`
		Signers struct {
			Rows []struct {
				Address string `json:"address"`
			} `json:"rows"`
		} `json:"signers"`
		Settlements struct {
			Available bool `json:"available"`
		} `json:"settlements"`
	}
	if err := json.Unmarshal(overview, &ov); err != nil || res.StatusCode != 200 || ov.Answers.VerifyTotal["valid"] != 1 ||
		len(ov.Signers.Rows) != 1 || ov.Signers.Rows[0].Address != chain.Accounts[0].Address.Hex() || !ov.Settlements.Available {
		t.Fatalf("ops overview: %d %s (%v)", res.StatusCode, overview, err)
	}

	// The signer key must appear nowhere the operator or a caller can see.
	bare := strings.TrimPrefix(keyHex, "0x")
	if strings.Contains(logs.String(), bare) || strings.Contains(string(body), bare) || strings.Contains(string(overview), bare) {
		t.Fatal("the signer key leaked into logs or a response")
	}
	if !strings.Contains(logs.String(), "facilitator listening") {
		t.Fatalf("no start-up log line: %s", logs.String())
	}
}

// TestServeRefusesAnotherChain: a database bound to one chain refuses to serve a different chain
// under the same network id (a restarted dev chain, an RPC URL pointed at the wrong network).
func TestServeRefusesAnotherChain(t *testing.T) {
	dbURL, first := requireStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Unbind the id first so this test does not depend on which chain other tests bound it to.
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	db.Close()

	start := func(chain *devchain.Chain) error {
		cfg, err := configFor(t, dbURL, chain, chain.Accounts[0].Key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Networks[0].ID = "eip155:31337"
		m := &Main{Config: cfg, Logger: newLogger(io.Discard, "error", "text")}
		defer m.Close()
		return m.Run(ctx)
	}
	// Either the first chain binds the id now, or an earlier test bound it to another chain.
	firstErr := start(first)
	// anvil's genesis hash depends on its start second: two chains started within one second are
	// indistinguishable, so start the second one until it is a different chain.
	var second *devchain.Chain
	for {
		second, err = devchain.Start(ctx, devchain.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		g1, err1 := first.Client.HeaderByNumber(ctx, big.NewInt(0))
		g2, err2 := second.Client.HeaderByNumber(ctx, big.NewInt(0))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if g1.Hash() != g2.Hash() {
			break
		}
		time.Sleep(time.Second)
	}
	if err := start(second); !errors.Is(err, postgres.ErrNetworkMismatch) {
		t.Fatalf("serving a second chain under the same id: want ErrNetworkMismatch, got %v (first start: %v)", err, firstErr)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]map[string]string{
		"no database":   {"FACILITATOR_NETWORKS": `[{"id":"eip155:1","rpc":"http://x","tokens":[{"address":"0x0000000000000000000000000000000000000001","name":"a","version":"1"}]}]`},
		"no networks":   {"DATABASE_URL": "postgres://x"},
		"bad network":   {"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": `[{"id":"base","rpc":"http://x","tokens":[]}]`},
		"no tokens":     {"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": `[{"id":"eip155:1","rpc":"http://x","tokens":[]}]`},
		"unknown field": {"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": `[{"id":"eip155:1","rpcUrl":"http://x"}]`},
	}
	for name, env := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
			if err == nil {
				err = cfg.Check()
			}
			if err == nil {
				t.Fatal("accepted")
			}
		})
	}
	secret := "0xnot-a-key-but-secret-looking-0123456789"
	_, err := parseServeFlags(nil, func(k string) string {
		if k == "FACILITATOR_SIGNER_KEYS" {
			return secret
		}
		return ""
	})
	if err == nil || strings.Contains(err.Error(), "secret-looking") {
		t.Fatalf("bad key: want an error that does not echo the key, got %v", err)
	}
}

func TestRunUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"bogus"}, func(string) string { return "" }, &out, &errOut); code != 2 {
		t.Fatalf("unknown command exit %d", code)
	}
	if code := run(context.Background(), nil, func(string) string { return "" }, &out, &errOut); code != 2 {
		t.Fatalf("no command exit %d", code)
	}
}

func bigInt(n int64) *big.Int { return big.NewInt(n) }

// TestTuneGC: the service raises the collector's target only when the operator has not set GOGC.
func TestTuneGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	if got := tuneGC(func(string) string { return "" }); got != serviceGCPercent {
		t.Fatalf("without GOGC: applied %d, want %d", got, serviceGCPercent)
	}
	if now := debug.SetGCPercent(100); now != serviceGCPercent {
		t.Fatalf("without GOGC the target is %d, want %d", now, serviceGCPercent)
	}
	if got := tuneGC(func(k string) string { return map[string]string{"GOGC": "50"}[k] }); got != -1 {
		t.Fatalf("with GOGC set: applied %d, want GOGC's own (-1)", got)
	}
	if now := debug.SetGCPercent(100); now != 100 {
		t.Fatalf("with GOGC set the target moved to %d", now)
	}
}
