package postgres

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// limitLockTimeout bounds the wait for a wallet's or key's lock inside an insert. The insert runs
// while the signer's commit waits for it (and, with leases, on the lease's session, which a
// cancelled statement would end): a wait that long means something is wrong, and the insert
// fails as a ledger error (503, nothing sent) rather than hold the signer.
const limitLockTimeout = "2s"

// keyGasWindow is the rolling period of a key's gas budget.
const keyGasWindow = 24 * time.Hour

// walletLockKey names the advisory lock that orders the inserts of one wallet's settlements of
// one asset on one network.
func walletLockKey(network string, asset, payer common.Address) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("x402-wallet:" + network + ":" + strings.ToLower(asset.Hex()) + ":" + strings.ToLower(payer.Hex())))
	return int64(h.Sum64())
}

// keyGasLockKey names the advisory lock that orders the inserts charged to one API key's budget.
func keyGasLockKey(keyID string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("x402-keygas:" + keyID))
	return int64(h.Sum64())
}

func orZero(n *big.Int) *big.Int {
	if n == nil {
		return new(big.Int)
	}
	return n
}

// limitRefusal explains an insert its guard refused: which limit, and when the same settlement
// would fit. The wait is read after the refusal, without the lock: it is advice, not a promise.
func (db *DB) limitRefusal(ctx context.Context, s *settle.NewSettlement, walletOK, gasOK bool) error {
	if !walletOK {
		g := s.Guard
		wait, err := db.secondsUntil(ctx, `
			SELECT EXTRACT(EPOCH FROM min(created_at) + make_interval(secs => $5::float8) - now())::float8 FROM (
				SELECT created_at, value, count(*) OVER newer AS n_from, sum(value) OVER newer AS v_from
				FROM settlements
				WHERE network = $1 AND asset = $2 AND payer = $3 AND state IN ('signed', 'broadcast', 'mined', 'final')
					AND created_at > now() - make_interval(secs => $5::float8)
				WINDOW newer AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) r
			-- r and every older row gone from the window, the rows left plus this one must fit.
			WHERE ($6::bigint = 0 OR n_from <= $6::bigint) AND ($7::numeric = 0 OR v_from - value + $4::numeric <= $7::numeric)`,
			s.Key.Network, s.Key.Asset[:], s.Key.Payer[:], numeric(s.Value), g.WalletWindow.Seconds(),
			int64(g.WalletCapCount), numeric(orZero(g.WalletCapAmount)))
		if err != nil {
			return err
		}
		if wait == 0 {
			wait = g.WalletWindow // the payment alone exceeds the cap: no wait makes it fit
		}
		return &facilitator.Error{Code: facilitator.ELimited, Reason: facilitator.ReasonWalletCapExceeded, RetryAfter: wait,
			Message: fmt.Sprintf("the paying wallet has reached this facilitator's cap of settlements of this asset over %s; nothing was sent, retry after Retry-After", g.WalletWindow)}
	}
	if !gasOK {
		wait, err := db.secondsUntil(ctx, `
			SELECT EXTRACT(EPOCH FROM min(created_at) + interval '24 hours' - now())::float8 FROM (
				SELECT created_at, gas_reserved AS gas, sum(gas_reserved) OVER newer AS gas_from
				FROM settlements
				WHERE api_key = $1 AND created_at > now() - interval '24 hours' AND gas_reserved IS NOT NULL
				WINDOW newer AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) r
			WHERE gas_from - gas + $2::numeric <= COALESCE((SELECT gas_budget_wei FROM api_keys WHERE id = $1), $3::numeric)`,
			s.KeyID, numeric(orZero(s.GasReserved)), numeric(orZero(s.Guard.KeyGasBudget)))
		if err != nil {
			return err
		}
		if wait == 0 {
			wait = keyGasWindow
		}
		return &facilitator.Error{Code: facilitator.ELimited, Reason: facilitator.ReasonGasBudgetExceeded, RetryAfter: wait,
			Message: "this API key's gas budget for the last 24 hours would be exceeded by this settlement; nothing was sent, retry after Retry-After"}
	}
	return fmt.Errorf("postgres: a settlement insert wrote nothing although its guard passed")
}

// secondsUntil runs a query answering a number of seconds (NULL: never) and returns it as a
// duration of at least a second; 0 means never.
func (db *DB) secondsUntil(ctx context.Context, sql string, args ...any) (time.Duration, error) {
	var secs *float64
	if err := db.pool.QueryRow(ctx, sql, args...).Scan(&secs); err != nil {
		return 0, err
	}
	if secs == nil {
		return 0, nil
	}
	return time.Duration(max(math.Ceil(*secs), 1)) * time.Second, nil
}

// WalletUsage is a wallet's settlements of one asset on one network within a window, as the wallet
// cap counts them.
func (db *DB) WalletUsage(ctx context.Context, network string, asset, payer common.Address, window time.Duration) (int, *big.Int, error) {
	var n int64
	var total pgtype.Numeric
	err := db.pool.QueryRow(ctx, `
		SELECT count(*), COALESCE(sum(value), 0) FROM settlements
		WHERE network = $1 AND asset = $2 AND payer = $3 AND state IN ('signed', 'broadcast', 'mined', 'final')
			AND created_at > now() - make_interval(secs => $4::float8)`,
		network, asset[:], payer[:], window.Seconds()).Scan(&n, &total)
	if err != nil {
		return 0, nil, err
	}
	return int(n), numericInt(total), nil
}
