package postgres_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// TestSettlementByKeyPlan: the lookup by authorization key, the first statement of every
// settlement, probes the unique index and nothing else, with a payer whose history is long, before
// and after the table has statistics, in custom and generic plans (pgx prepares statements, so
// the generic plan is the one a busy connection runs). Before migration 0016 the planner, without
// statistics, took the wallet cap's (network, asset, payer, created_at) index and read the payer's
// every row to find one nonce. The wallet cap's own query still uses that index.
func TestSettlementByKeyPlan(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, conn := migratedDB(ctx, t, freshDB(ctx, t, "plans"))
	const network = "eip155:31337"
	if err := db.BindNetwork(ctx, network, 31337, common.HexToHash("0x03")); err != nil {
		t.Fatal(err)
	}
	// One payer with 5,000 settlements, and 50 other payers with one each.
	if _, err := conn.Exec(ctx, `
		INSERT INTO settlements (network, asset, payer, auth_nonce, fingerprint, pay_to, value, valid_after,
			valid_before, x402_version, request, signer, tx_nonce, state)
		SELECT $1, '\x00000000000000000000000000000000000000aa'::bytea,
			CASE WHEN i <= 5000 THEN '\x00000000000000000000000000000000000000bb'::bytea
				ELSE substring(sha256(int8send(i)) FROM 1 FOR 20) END,
			sha256(int8send(i)), sha256(int8send(-i)), '\x00000000000000000000000000000000000000cc'::bytea,
			1, 0, 4102444800, 2, '{}'::bytea, '\x00000000000000000000000000000000000000dd'::bytea, i,
			CASE WHEN i % 2 = 0 THEN 'final' ELSE 'expired' END
		FROM generate_series(1, 5050) i`, network); err != nil {
		t.Fatal(err)
	}
	asset := common.HexToAddress("0xaa").Bytes()
	payer := common.HexToAddress("0xbb").Bytes()
	var missing [32]byte
	prepared := 0
	plan := func(t *testing.T, sql string, args ...any) string {
		t.Helper()
		prepared++
		name := fmt.Sprintf("q%d", prepared)
		if _, err := conn.Exec(ctx, `PREPARE `+name+` AS `+sql); err != nil {
			t.Fatal(err)
		}
		// EXECUTE takes no parameters of its own: the arguments go in as literals.
		literals := make([]string, len(args))
		for i, a := range args {
			switch a := a.(type) {
			case string:
				literals[i] = "'" + a + "'"
			case []byte:
				literals[i] = `'\x` + hex.EncodeToString(a) + `'::bytea`
			default:
				literals[i] = fmt.Sprint(a)
			}
		}
		var out string
		if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE `+name+`(`+strings.Join(literals, ", ")+`)`).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(t *testing.T) {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
				t.Fatal(err)
			}
			got := plan(t, postgres.SettlementByKeySQL, network, asset, payer, missing[:])
			// The statement's only scan of settlements is the unique index; the subquery reads
			// settlement_txs by its own index.
			if !strings.Contains(got, `"Index Name": "settlements_network_asset_payer_auth_nonce_key"`) ||
				strings.Contains(got, "settlements_payer_created") || strings.Contains(got, "Seq Scan") {
				t.Errorf("%s: SettlementByKey's plan is not one unique index probe:\n%s", mode, got)
			}
			got = plan(t, `SELECT count(*) FROM settlements
				WHERE network = $1 AND asset = $2 AND payer = $3 AND state IN ('signed', 'broadcast', 'mined', 'final')
					AND created_at > now() - make_interval(secs => $4::float8)`, network, asset, payer, 60.0)
			if !strings.Contains(got, "settlements_payer_created") {
				t.Errorf("%s: the wallet cap's count does not use its window index:\n%s", mode, got)
			}
		}
	}
	t.Run("no statistics", check)
	if _, err := conn.Exec(ctx, `ANALYZE settlements`); err != nil {
		t.Fatal(err)
	}
	t.Run("analyzed", check)
}
