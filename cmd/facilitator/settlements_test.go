package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestSettlementsStuck: `facilitator settlements stuck` lists, from the ledger, the settlements
// open (signed, broadcast, mined and not final) longer than --older-than, by state and oldest
// first, with id, network, signer, payer, nonce, state, age and transaction hash; resolved ones
// and younger ones are left out; --signer keeps one key's (a retiring key's drain).
func TestSettlementsStuck(t *testing.T) {
	ctx, dbURL, _, conn := opsLedger(t, "opcli_stuck")
	const network = opsNetwork
	asset, signer := common.HexToAddress("0xa5"), common.HexToAddress("0x51")

	type settlement struct {
		id    int64
		payer common.Address
		nonce [32]byte
		tx    common.Hash
	}
	n := 0
	// insert writes a settlement signed age ago in state; tx, when set, is its one transaction
	// (for mined, on the row as well: the variant that was mined).
	insert := func(state string, age time.Duration, tx common.Hash) settlement {
		t.Helper()
		n++
		s := settlement{payer: common.BigToAddress(big.NewInt(int64(0x1000 + n))), tx: tx}
		s.nonce[0], s.nonce[31] = byte(n), 0xee
		var mined []byte
		if state == "mined" {
			mined = tx.Bytes()
		}
		err := conn.QueryRow(ctx, `INSERT INTO settlements (network, asset, payer, auth_nonce, pay_to, value, valid_after,
				valid_before, x402_version, request, fingerprint, signer, tx_nonce, state, tx_hash, created_at)
			VALUES ($1, $2, $3, $4, $2, 1, 0, 99999999999, 2, '\x7b7d', $4, $5, $6, $7, $8, now() - make_interval(secs => $9))
			RETURNING id`, network, asset[:], s.payer[:], s.nonce[:], signer[:], n, state, mined, age.Seconds()).Scan(&s.id)
		if err != nil {
			t.Fatal(err)
		}
		if tx != (common.Hash{}) {
			if _, err := conn.Exec(ctx, `INSERT INTO settlement_txs (tx_hash, settlement_id, raw, gas_tip_cap, gas_fee_cap)
				VALUES ($1, $2, '\x00', 1, 1)`, tx[:], s.id); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	hash := func(b byte) common.Hash { return common.BytesToHash(bytes.Repeat([]byte{b}, 32)) }
	minedOld := insert("mined", 40*time.Minute, hash(0xa1))
	broadcastOld := insert("broadcast", 30*time.Minute, hash(0xb1))
	signedOld := insert("signed", 20*time.Minute, common.Hash{})
	broadcastOlder := insert("broadcast", 50*time.Minute, hash(0xb2))
	young := insert("broadcast", 2*time.Minute, hash(0xb3))
	insert("final", 2*time.Hour, hash(0xf1))
	insert("reverted", 2*time.Hour, hash(0xf2))
	insert("expired", 2*time.Hour, common.Hash{})

	cli := func(args ...string) (int, string) {
		var out, errs bytes.Buffer
		code := run(ctx, append([]string{"settlements", "stuck"}, args...), func(k string) string {
			return map[string]string{"DATABASE_URL": dbURL}[k]
		}, &out, &errs)
		return code, out.String() + errs.String()
	}
	code, out := cli()
	if code != 0 || !strings.HasPrefix(out, "4 settlement(s) open longer than 10m0s: signed 1, broadcast 2, mined 1\n") {
		t.Fatalf("stuck: exit %d\n%s", code, out)
	}
	// By state, oldest first; each row with its payer, nonce, age and hash (the latest signed
	// variant while nothing is mined; "-" before the first broadcast).
	var lines []string
	for _, l := range strings.Split(out, "\n")[3:] {
		if l != "" {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
	}
	want := []string{
		fmt.Sprintf("%d %s %s %s %s signed 20m0s -", signedOld.id, network, signer.Hex(), signedOld.payer.Hex(), hexutil.Encode(signedOld.nonce[:])),
		fmt.Sprintf("%d %s %s %s %s broadcast 50m0s %s", broadcastOlder.id, network, signer.Hex(), broadcastOlder.payer.Hex(), hexutil.Encode(broadcastOlder.nonce[:]), broadcastOlder.tx.Hex()),
		fmt.Sprintf("%d %s %s %s %s broadcast 30m0s %s", broadcastOld.id, network, signer.Hex(), broadcastOld.payer.Hex(), hexutil.Encode(broadcastOld.nonce[:]), broadcastOld.tx.Hex()),
		fmt.Sprintf("%d %s %s %s %s mined 40m0s %s", minedOld.id, network, signer.Hex(), minedOld.payer.Hex(), hexutil.Encode(minedOld.nonce[:]), minedOld.tx.Hex()),
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("stuck rows:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	code, out = cli("--older-than", "1m", "--limit", "2", "--json")
	var got struct {
		Settlements []stuckRow `json:"settlements"`
		More        bool       `json:"more"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	if !got.More || len(got.Settlements) != 2 || got.Settlements[0].ID != signedOld.id || got.Settlements[1].ID != broadcastOlder.id ||
		got.Settlements[1].TxHash != broadcastOlder.tx.Hex() || got.Settlements[1].AgeSeconds < 3000 {
		t.Errorf("--older-than 1m --limit 2 --json: %+v", got)
	}
	code, out = cli("--older-than", "1m")
	if code != 0 || !strings.Contains(out, "5 settlement(s)") || !strings.Contains(out, young.tx.Hex()) {
		t.Errorf("--older-than 1m: exit %d, want the young one too:\n%s", code, out)
	}
	if code, out = cli("--older-than", "3h"); code != 0 || out != "no settlement open longer than 3h0m0s\n" {
		t.Errorf("--older-than 3h: exit %d\n%s", code, out)
	}
	// One key's only: what a retiring key has left; none left is said so.
	if code, out = cli("--older-than", "0", "--signer", signer.Hex()); code != 0 || !strings.HasPrefix(out, "5 settlement(s) open longer than 0s") || !strings.Contains(out, signer.Hex()) {
		t.Errorf("--signer %s: exit %d\n%s", signer.Hex(), code, out)
	}
	other := common.HexToAddress("0x52")
	if code, out = cli("--older-than", "0", "--signer", other.Hex()); code != 0 || out != "no settlement of signer "+other.Hex()+" open longer than 0s\n" {
		t.Errorf("--signer of a key with nothing open: exit %d\n%s", code, out)
	}
	if code, out = cli("--signer", "0x12"); code != 1 || !strings.Contains(out, "is not an address") {
		t.Errorf("--signer 0x12: exit %d\n%s", code, out)
	}
	if code, out = cli("--older-than", "-1s"); code != 1 || !strings.Contains(out, "must not be negative") {
		t.Errorf("--older-than -1s: exit %d\n%s", code, out)
	}
}

// opsNetwork is the network opsLedger binds.
const opsNetwork = "eip155:31337"

// opsLedger is a migrated ledger of the test's own, bound to opsNetwork, and a connection to it
// for the rows a test writes directly: the operator commands read the database, as these tests
// do. Everything is closed when the test ends; ctx bounds it to a minute.
func opsLedger(t *testing.T, name string) (context.Context, string, *postgres.DB, *pgx.Conn) {
	t.Helper()
	dbURL := stacktest.NewDB(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db, err := openDB(ctx, dbURL, newLogger(&bytes.Buffer{}, "warn", "text"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.BindNetwork(ctx, opsNetwork, 31337, common.HexToHash("0x01")); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return ctx, dbURL, db, conn
}
