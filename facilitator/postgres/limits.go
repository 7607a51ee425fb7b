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
	"github.com/x402-facilitator/x402-facilitator/facilitator"
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
func (db *DB) limitRefusal(ctx context.Context, s *facilitator.NewSettlement, walletOK, gasOK bool) error {
	if !walletOK {
		g := s.Limits
		wait, err := db.walletWait(ctx, s.Key.Network, s.Key.Asset, s.Key.Payer, s.Value, g)
		if err != nil {
			return err
		}
		return facilitator.WalletCapExceeded(wait, g.WalletWindow)
	}
	if !gasOK {
		wait, err := db.secondsUntil(ctx, `
			SELECT EXTRACT(EPOCH FROM min(created_at) + interval '24 hours' - now())::float8 FROM (
				SELECT created_at, gas_reserved AS gas, sum(gas_reserved) OVER newer AS gas_from
				FROM settlements
				WHERE api_key = $1 AND created_at > now() - interval '24 hours' AND gas_reserved IS NOT NULL
				WINDOW newer AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) r
			WHERE gas_from - gas + $2::numeric <= COALESCE((SELECT gas_budget_wei FROM api_keys WHERE id = $1), $3::numeric)`,
			s.KeyID, numeric(orZero(s.GasReserved)), numeric(orZero(s.Limits.KeyGasBudget)))
		if err != nil {
			return err
		}
		if wait == 0 {
			wait = keyGasWindow // this settlement alone exceeds the budget
		}
		return facilitator.GasBudgetExceeded(wait)
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

// WalletCapWait is how long until a settlement of value by payer would fit the guard's wallet
// caps: 0 when it fits now, the whole window when it never can. It reads without a lock: /verify's
// advice, which InsertSettlement enforces exactly.
func (db *DB) WalletCapWait(ctx context.Context, network string, asset, payer common.Address, value *big.Int, g facilitator.Limits) (time.Duration, error) {
	if !g.WalletCapped() {
		return 0, nil
	}
	var fits bool
	err := db.pool.QueryRow(ctx, `
		SELECT ($4::bigint = 0 OR count(*) < $4::bigint) AND ($5::numeric = 0 OR COALESCE(sum(value), 0) + $6::numeric <= $5::numeric)
		FROM settlements
		WHERE network = $1 AND asset = $2 AND payer = $3 AND state IN ('signed', 'broadcast', 'mined', 'final')
			AND created_at > now() - make_interval(secs => $7::float8)`,
		network, asset[:], payer[:], int64(g.WalletCapCount), numeric(orZero(g.WalletCapAmount)), numeric(value),
		g.WalletWindow.Seconds()).Scan(&fits)
	if err != nil || fits {
		return 0, err
	}
	return db.walletWait(ctx, network, asset, payer, value, g)
}

// walletWait is how long until a settlement of value by payer fits the wallet caps, assuming it
// does not now: when enough of the oldest settlements have left the window. When the payment
// alone exceeds the amount cap no wait makes it fit, and the answer is the whole window.
func (db *DB) walletWait(ctx context.Context, network string, asset, payer common.Address, value *big.Int, g facilitator.Limits) (time.Duration, error) {
	wait, err := db.secondsUntil(ctx, `
		SELECT EXTRACT(EPOCH FROM min(created_at) + make_interval(secs => $5::float8) - now())::float8 FROM (
			SELECT created_at, value, count(*) OVER newer AS n_from, sum(value) OVER newer AS v_from
			FROM settlements
			WHERE network = $1 AND asset = $2 AND payer = $3 AND state IN ('signed', 'broadcast', 'mined', 'final')
				AND created_at > now() - make_interval(secs => $5::float8)
			WINDOW newer AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) r
		-- r and every older row gone from the window, the rows left plus this one must fit.
		WHERE ($6::bigint = 0 OR n_from <= $6::bigint) AND ($7::numeric = 0 OR v_from - value + $4::numeric <= $7::numeric)`,
		network, asset[:], payer[:], numeric(value), g.WalletWindow.Seconds(),
		int64(g.WalletCapCount), numeric(orZero(g.WalletCapAmount)))
	if err != nil {
		return 0, err
	}
	if wait == 0 {
		wait = g.WalletWindow
	}
	return wait, nil
}
