package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestNarrowSignerCommand: `facilitator signer` holds the key and `serve --signer clef:URL`
// holds only its address. A payment settles once through it; with the signer down the next one
// is answered 503 signer_unavailable and nothing is written or sent; and neither process prints
// the key or the signer URL's password.
func TestNarrowSignerCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h := newCrashHarness(ctx, t)
	keyHex := h.env["FACILITATOR_SIGNER_KEYS"]
	signer := startSigner(ctx, t, h.bin, map[string]string{"FACILITATOR_SIGNER_KEYS": keyHex},
		"--chain-id", "31337", "--token", h.chain.USDC.Address.Hex(), "--token-name", h.chain.USDC.Name, "--token-version", h.chain.USDC.Version,
		"--max-gas", "300000", "--max-fee-gwei", "1000")
	delete(h.env, "FACILITATOR_SIGNER_KEYS")
	h.env["FACILITATOR_SIGNER"] = "clef:http://operator:SECRETPW@" + signer.base[len("http://"):] + "/"
	h.env["FACILITATOR_SIGNER_ADDRESSES"] = h.signer.Hex()
	serve := h.start(ctx, t, "serve", "")

	res, err := serve.client.Get(serve.base + "/supported")
	if err != nil {
		t.Fatal(err)
	}
	var sup facilitator.SupportedResponse
	err = json.NewDecoder(res.Body).Decode(&sup)
	res.Body.Close()
	if err != nil || len(sup.Signers["eip155:*"]) != 1 || sup.Signers["eip155:*"][0] != h.signer.Hex() {
		t.Fatalf("/supported signers %v (%v), want the remote key %s", sup.Signers, err, h.signer)
	}

	pay := func() ([]byte, facilitator.AuthorizationKey) {
		payer, payee := newAccount(t), newAccount(t).Address
		if err := h.chain.USDC.Mint(ctx, payer.Address, big.NewInt(100_000)); err != nil {
			t.Fatal(err)
		}
		var nonce [32]byte
		_, _ = rand.Read(nonce[:])
		key := facilitator.AuthorizationKey{Network: h.network, Asset: h.chain.USDC.Address, Payer: payer.Address, Nonce: nonce}
		return h.payment(t, payer, payee, big.NewInt(40_000), nonce), key
	}
	body, key := pay()
	out, status, err := serve.settle(body)
	if err != nil || status != http.StatusOK || !out.Success {
		t.Fatalf("settle through the narrow signer: %d %+v %v", status, out, err)
	}
	row, err := h.db.SettlementByKey(ctx, key)
	if err != nil || !row.State.Succeeded() || row.Signer != h.signer || row.TxHash.Hex() != out.Transaction {
		t.Fatalf("ledger row %+v %v", row, err)
	}
	if n := h.nonce(ctx, t, false); n != 1 {
		t.Fatalf("the key sent %d transactions, want 1", n)
	}
	if !strings.Contains(signer.logs.String(), "signed") {
		t.Fatalf("the signer did not log its signature:\n%s", signer.logs.String())
	}
	// A compromised facilitator asking for a settlement of an authorization nobody signed (the
	// signer checks it in the token's domain, as configured) gets a refusal saying so.
	ep, err := extsigner.Dial(ctx, signer.base, h.chain.ChainID)
	if err != nil {
		t.Fatal(err)
	}
	forged := eip3009.TransferCalldata(facilitator.Authorization{From: newAccount(t).Address, To: newAccount(t).Address, Value: big.NewInt(1),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(4102444800)}, make([]byte, 65))
	usdc := h.chain.USDC.Address
	_, err = ep.Signer(h.signer).SignTx(ctx, &types.DynamicFeeTx{Nonce: 1, GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(2e9), Gas: 120_000, To: &usdc, Data: forged})
	ep.Close()
	if err == nil || !strings.Contains(err.Error(), "does not recover to its from") {
		t.Fatalf("a forged authorization: %v, want a refusal", err)
	}

	// The signer goes down: the next payment is refused with nothing written or sent.
	signer.stop(t)
	body, key = pay()
	out, status, err = serve.settle(body)
	if err != nil || status != http.StatusServiceUnavailable || out.Success || out.ErrorReason != facilitator.ReasonSignerUnavailable {
		t.Fatalf("settle with the signer down: %d %+v %v, want 503 %s", status, out, err, facilitator.ReasonSignerUnavailable)
	}
	if _, err := h.db.SettlementByKey(ctx, key); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("a ledger row after a failed sign: %v", err)
	}
	if n := h.nonce(ctx, t, true); n != 1 {
		t.Fatalf("the key's pending nonce is %d after a failed sign, want 1", n)
	}
	// The metrics say so: the signature that was given, and the one the signer was not there for.
	res, err = serve.client.Get(serve.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scraped, _ := io.ReadAll(res.Body)
	res.Body.Close()
	labels := fmt.Sprintf(`network=%q,signer=%q`, h.network, h.signer.Hex())
	for _, want := range []string{
		fmt.Sprintf(`facilitator_remote_signer_refusals_total{network=%q,reason="unreachable",signer=%q} 1`, h.network, h.signer.Hex()),
		"facilitator_remote_signer_last_signature_timestamp_seconds{" + labels + "} ",
		"facilitator_remote_signer_up{" + labels + "} 0",
	} {
		if !strings.Contains(string(scraped), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, grepLines(string(scraped), "remote_signer"))
		}
	}
	serve.stop(t)

	bare := strings.TrimPrefix(keyHex, "0x")
	for name, logs := range map[string]string{"serve": serve.logs.String(), "signer": signer.logs.String()} {
		if strings.Contains(logs, "SECRETPW") || strings.Contains(logs, bare) {
			t.Fatalf("%s printed the signer URL's password or the key:\n%s", name, logs)
		}
	}
}

// startSigner runs `facilitator signer` with env and args on a free port and returns once it
// accepts connections.
func startSigner(ctx context.Context, t *testing.T, bin string, env map[string]string, args ...string) *child {
	t.Helper()
	addr := freeAddr(t)
	c := launch(t, bin, env, "signer", addr, append([]string{"signer", "--listen", addr}, args...)...)
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-c.exited:
			t.Fatalf("the signer exited at start: %v\n%s", c.cmd.ProcessState, c.logs.String())
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		default:
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the signer does not listen after 30s:\n%s", c.logs.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// TestSignerConfig: the remote signer's settings are checked before anything starts, and an
// error never repeats the URL.
func TestSignerConfig(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://x/y", "FACILITATOR_NETWORKS": `[{"id":"eip155:31337","rpc":"http://127.0.0.1:1","tokens":[{"address":"0x244ae02008762968261615a485542a9c7512c562","name":"USD Coin","version":"2"}]}]`}
	two := `[{"id":"eip155:31337","rpc":"http://127.0.0.1:1","tokens":[{"address":"0x244ae02008762968261615a485542a9c7512c562","name":"USD Coin","version":"2"}]},` +
		`{"id":"eip155:31338","rpc":"http://127.0.0.1:1","tokens":[{"address":"0x244ae02008762968261615a485542a9c7512c562","name":"USD Coin","version":"2"}]}]`
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"not clef", map[string]string{"FACILITATOR_SIGNER": "web3signer:http://a:SECRETPW@h/"}, "want clef:"},
		{"not http", map[string]string{"FACILITATOR_SIGNER": "clef:/tmp/clef.ipc"}, "want clef:"},
		{"bad address", map[string]string{"FACILITATOR_SIGNER": "clef:http://h/", "FACILITATOR_SIGNER_ADDRESSES": "0x12"}, "not an address"},
		{"two networks", map[string]string{"FACILITATOR_SIGNER": "clef:http://h/", "FACILITATOR_NETWORKS": two}, "one chain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
			if err == nil {
				err = cfg.Check()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRETPW") {
				t.Fatalf("want an error saying %q (and no password), got %v", tc.want, err)
			}
		})
	}
	// Several networks, each with a remote signer of its own; a bad one is refused by network.
	perNet := `[{"id":"eip155:31337","rpc":"http://127.0.0.1:1","signer":"clef:http://127.0.0.1:8550/","signerAddresses":["0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"],"tokens":[{"address":"0x244ae02008762968261615a485542a9c7512c562","name":"USD Coin","version":"2"}]},` +
		`{"id":"eip155:31338","rpc":"http://127.0.0.1:1","signer":"clef:http://127.0.0.1:8551/","tokens":[{"address":"0x244ae02008762968261615a485542a9c7512c562","name":"USD Coin","version":"2"}]}]`
	for _, tc := range []struct {
		name, networks, want string
	}{
		{"a signer per network", perNet, ""},
		{"one network's signer is not clef", strings.Replace(perNet, `"clef:http://127.0.0.1:8551/"`, `"web3signer:http://a:SECRETPW@h/"`, 1), "networks[1] (eip155:31338)"},
		{"one network without any signer", strings.Replace(perNet, `"signer":"clef:http://127.0.0.1:8551/",`, "", 1), "networks[1] (eip155:31338): no signer keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": "postgres://x/y", "FACILITATOR_NETWORKS": tc.networks}
			cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
			if err == nil {
				err = cfg.Check()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("a signer per network: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRETPW")):
				t.Fatalf("want an error saying %q (and no password), got %v", tc.want, err)
			}
			if tc.want == "" {
				spec, addrs, _ := cfg.remoteSignerOf(cfg.Networks[0])
				spec2, addrs2, _ := cfg.remoteSignerOf(cfg.Networks[1])
				if spec == spec2 || len(addrs) != 1 || len(addrs2) != 0 {
					t.Fatalf("each network's signer: %q %v, %q %v", spec, addrs, spec2, addrs2)
				}
			}
		})
	}
	// Only the remote signer: no local key is needed.
	env := map[string]string{"FACILITATOR_SIGNER": "clef:http://127.0.0.1:8550/", "FACILITATOR_SIGNER_ADDRESSES": "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"}
	for k, v := range base {
		env[k] = v
	}
	cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Check(); err != nil || len(cfg.RemoteAddresses) != 1 || len(cfg.SignerKeys) != 0 {
		t.Fatalf("a remote signer alone: %v %+v", err, cfg.RemoteAddresses)
	}
}

// TestSignerTokenDomain: `facilitator signer` checks signatures in the domain given, or else in
// the network preset's whose chain and USDC it signs for; with neither it refuses to start.
func TestSignerTokenDomain(t *testing.T) {
	base := chains.Presets()[0]
	if name, version, err := signerTokenDomain(base.ChainID, base.USDC.Address, "", ""); err != nil || name != base.USDC.Name || version != base.USDC.Version {
		t.Fatalf("the preset's domain: %q %q %v, want %q %q", name, version, err, base.USDC.Name, base.USDC.Version)
	}
	if name, version, err := signerTokenDomain(31337, common.HexToAddress("0x01"), "USD Coin", "2"); err != nil || name != "USD Coin" || version != "2" {
		t.Fatalf("given: %q %q %v", name, version, err)
	}
	if _, _, err := signerTokenDomain(31337, common.HexToAddress("0x01"), "", ""); err == nil || !strings.Contains(err.Error(), "--token-name and --token-version are required") {
		t.Fatalf("no preset, none given: %v", err)
	}
}

// TestRemoteSignerHealth: serve probes its remote signer, so a signer that goes down shows in
// /readyz (which stays ready: /verify still works) and in the metrics before any payment meets
// it, and so does its coming back.
func TestRemoteSignerHealth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, chain := requireStack(t)
	key := chain.Accounts[0].Key
	addr := crypto.PubkeyToAddress(key.PublicKey)
	srv, err := extsigner.NewServer(extsigner.Policy{ChainID: chain.ChainID, Token: chain.USDC.Address, TokenName: chain.USDC.Name,
		TokenVersion: chain.USDC.Version, MaxGas: 300_000, MaxFeeCap: big.NewInt(1e12)}, []*ecdsa.PrivateKey{key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := srv.Handler()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	env := serveEnv(t, dbURL, chain, chain.RPCURL)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_SIGNER"] = "clef:http://" + ln.Addr().String() + "/"
	env["FACILITATOR_SIGNER_ADDRESSES"] = addr.Hex()
	env["FACILITATOR_BALANCE_INTERVAL"] = "100ms"
	m := startMain(ctx, t, serveConfig(t, env), stacktest.Logger(t))
	defer m.Close()
	base := "http://" + m.Addr
	get := func(path string) (int, string) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	signerKey := facilitator.CAIP2(chain.ChainID) + "/" + addr.Hex()
	upSeries := fmt.Sprintf(`facilitator_remote_signer_up{network=%q,signer=%q}`, facilitator.CAIP2(chain.ChainID), addr.Hex())
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				_, ready := get("/readyz")
				_, metrics := get("/metrics")
				t.Fatalf("%s: not within 20s\n/readyz: %s\n/metrics (remote signer):\n%s", what, ready, grepLines(metrics, "remote_signer"))
			}
		}
	}
	readyState := func() (int, string) {
		status, body := get("/readyz")
		var r api.ReadyResponse
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("/readyz: %v: %s", err, body)
		}
		return status, r.Signers[signerKey]
	}
	metricIs := func(series, value string) func() bool {
		return func() bool { _, body := get("/metrics"); return strings.Contains(body, series+" "+value+"\n") }
	}
	waitFor("the signer up in /readyz", func() bool { status, s := readyState(); return status == http.StatusOK && s == "ok" })
	waitFor("the signer up in /metrics", metricIs(upSeries, "1"))

	hs.Close()
	waitFor("the signer down in /readyz, the process still ready", func() bool {
		status, s := readyState()
		return status == http.StatusOK && strings.HasPrefix(s, "down: ") && strings.Contains(s, "connection refused")
	})
	waitFor("the signer down in /metrics", metricIs(upSeries, "0"))
	_, body := get("/metrics")
	if !strings.Contains(body, fmt.Sprintf(`facilitator_remote_signer_refusals_total{network=%q,reason="unreachable",signer=%q} 0`, facilitator.CAIP2(chain.ChainID), addr.Hex())) {
		t.Fatalf("no refusals series (a probe is not a refusal):\n%s", grepLines(body, "remote_signer"))
	}

	// Back on the same address.
	ln2, err := net.Listen("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	hs2 := &http.Server{Handler: h}
	go func() { _ = hs2.Serve(ln2) }()
	defer hs2.Close()
	waitFor("the signer up again", func() bool { _, s := readyState(); return s == "ok" })
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
