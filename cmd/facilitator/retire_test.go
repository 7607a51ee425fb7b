package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestRetireSigner is a signer key's retirement on the real stack (anvil, the real USDC,
// Postgres, serve's wiring): settlements in flight on key A when serve restarts with A retiring
// (their transactions dropped from the node's pool, so they must be sent again) are finished from
// A; new settlements go to B only, while A has some open and once it has none; and /readyz and
// the metrics show A draining, then drained.
func TestRetireSigner(t *testing.T) {
	dbURL, chain := requireStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := chain.Accounts[0], chain.Accounts[5]
	network := facilitator.CAIP2(chain.ChainID)
	stacktest.ManualMining(t, chain)

	env := serveEnv(t, dbURL, chain, chain.RPCURL, a.Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_SETTLE_TIMEOUT"] = "1s" // nothing is mined: each /settle answers pending
	m1 := startMain(ctx, t, serveConfig(t, env), newLogger(io.Discard, "error", "text"))
	payee := chain.Accounts[2].Address
	for i := byte(1); i <= 2; i++ {
		if res := post(t, "http://"+m1.Addr+"/settle", paymentBody(t, chain, payee, [32]byte{0x52, 0x45, 0x54, i})); !strings.Contains(res, facilitator.ReasonSettlementPending) {
			t.Fatalf("settle %d on A, unmined: %s", i, res)
		}
	}
	m1.Close()
	if err := chain.RPC.CallContext(ctx, nil, "anvil_dropAllTransactions"); err != nil {
		t.Fatal(err)
	}

	env = serveEnv(t, dbURL, chain, chain.RPCURL, a.Key, b.Key)
	env["FACILITATOR_LISTEN"] = "127.0.0.1:0"
	env["FACILITATOR_SETTLE_TIMEOUT"] = "1s"
	env["FACILITATOR_RETIRE_SIGNERS"] = a.Address.Hex()
	m2 := startMain(ctx, t, serveConfig(t, env), newLogger(io.Discard, "error", "text"))
	defer m2.Close()
	base := "http://" + m2.Addr
	signerState := func(addr common.Address) string {
		t.Helper()
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var body struct {
			Signers map[string]string `json:"signers"`
		}
		if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return body.Signers[network+"/"+addr.Hex()]
	}
	aLabels := map[string]string{"network": network, "signer": a.Address.Hex()}
	if got := signerState(a.Address); got != "retiring: 2 open settlement(s) to finish from it" {
		t.Fatalf("/readyz of the retiring key with two open: %q", got)
	}
	if got := signerState(b.Address); got != "" {
		t.Fatalf("/readyz of a key that is not retiring (and not remote): %q", got)
	}
	fs := scrape(t, base)
	if find(t, fs, "facilitator_signer_retiring", aLabels).GetGauge().GetValue() != 1 ||
		find(t, fs, "facilitator_signer_open_settlements", aLabels).GetGauge().GetValue() != 2 ||
		find(t, fs, "facilitator_signer_retiring", map[string]string{"network": network, "signer": b.Address.Hex()}).GetGauge().GetValue() != 0 {
		t.Fatal("the metrics do not show A retiring with two open, and B not retiring")
	}

	if res := post(t, base+"/settle", paymentBody(t, chain, payee, [32]byte{0x52, 0x45, 0x54, 3})); !strings.Contains(res, facilitator.ReasonSettlementPending) {
		t.Fatalf("a new settlement with A retiring: %s", res)
	}

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	type row struct {
		signer common.Address
		state  string
		tx     common.Hash
	}
	ledger := func() []row { // read by id: the order they were made in
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT signer, state, tx_hash FROM settlements ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []row
		for rows.Next() {
			var signer, tx []byte
			var st string
			if err := rows.Scan(&signer, &st, &tx); err != nil {
				t.Fatal(err)
			}
			out = append(out, row{common.BytesToAddress(signer), st, common.BytesToHash(tx)})
		}
		return out
	}
	var rows []row
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if err := chain.Mine(ctx); err != nil {
			t.Fatal(err)
		}
		rows = ledger()
		final := 0
		for _, r := range rows {
			if r.state == string(facilitator.StateFinal) {
				final++
			}
		}
		if len(rows) == 3 && final == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the settlements are not final: %+v", rows)
		}
	}
	for i, want := range []common.Address{a.Address, a.Address, b.Address} {
		var tx struct {
			From common.Address `json:"from"`
		}
		if err := chain.RPC.CallContext(ctx, &tx, "eth_getTransactionByHash", rows[i].tx); err != nil {
			t.Fatal(err)
		}
		if rows[i].signer != want || tx.From != want {
			t.Errorf("settlement %d: ledger signer %s, mined from %s; want %s", i+1, rows[i].signer, tx.From, want)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st := signerState(a.Address)
		open := find(t, scrape(t, base), "facilitator_signer_open_settlements", aLabels).GetGauge().GetValue()
		if st == "retiring: drained (nothing open); it can be removed from the signer keys" && open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A finished its settlements and is not shown drained: /readyz %q, open %v", st, open)
		}
	}
	// Drained, A has no transaction in flight, as B has none: still, a new settlement is B's.
	if res := post(t, base+"/settle", paymentBody(t, chain, payee, [32]byte{0x52, 0x45, 0x54, 4})); !strings.Contains(res, facilitator.ReasonSettlementPending) {
		t.Fatalf("a new settlement with A drained: %s", res)
	}
	if rows = ledger(); len(rows) != 4 || rows[3].signer != b.Address {
		t.Fatalf("the settlement after A drained: %d settlements, the last on %s; want it on B %s", len(rows), rows[len(rows)-1].signer.Hex(), b.Address)
	}
}
