package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/big"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// settlementColumns reads a row; tx_hash falls back to the latest signed variant while nothing is
// mined, so an open settlement still answers with the hash it may land under.
const settlementColumns = `id, network, asset, payer, auth_nonce, fingerprint, pay_to, value, valid_before,
	signer, tx_nonce, state,
	COALESCE(tx_hash, (SELECT t.tx_hash FROM settlement_txs t WHERE t.settlement_id = ` + familyID + `
		ORDER BY t.created_at DESC, t.tx_hash DESC LIMIT 1)),
	block_number, error_reason, error_message, success_delivered_at IS NOT NULL, created_at, block_hash, batch_slot, success_takeovers,
	adopted_at IS NOT NULL`

// familyID is the settlement whose settlement_txs rows hold a settlements row's transactions: its
// own, or for a batch's member past slot 0, the slot-0 member's at the same (network, signer,
// tx_nonce) (migration 0017).
const familyID = `(CASE WHEN settlements.batch_slot = 0 THEN settlements.id ELSE (SELECT z.id FROM settlements z
		WHERE z.network = settlements.network AND z.signer = settlements.signer AND z.tx_nonce = settlements.tx_nonce
			AND z.batch_slot = 0) END)`

func scanSettlement(row pgx.Row) (*facilitator.Settlement, error) { return scanSettlementWith(row) }

// scanSettlementWith reads a row of settlementColumns followed by extra columns into extra.
func scanSettlementWith(row pgx.Row, extra ...any) (*facilitator.Settlement, error) {
	var (
		s                                     facilitator.Settlement
		asset, payer, nonce, fp, payTo, signr []byte
		txHash, blockHash                     []byte
		value, validBefore                    pgtype.Numeric
		block                                 *int64
		reason, message                       *string
		state                                 string
		txNonce                               int64
		slot                                  int16
	)
	err := row.Scan(append([]any{&s.ID, &s.Key.Network, &asset, &payer, &nonce, &fp, &payTo, &value, &validBefore,
		&signr, &txNonce, &state, &txHash, &block, &reason, &message, &s.Delivered, &s.CreatedAt, &blockHash, &slot, &s.ClaimTakeovers, &s.Adopted}, extra...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, facilitator.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	s.Key.Asset, s.Key.Payer, s.PayTo, s.Signer = common.BytesToAddress(asset), common.BytesToAddress(payer), common.BytesToAddress(payTo), common.BytesToAddress(signr)
	copy(s.Key.Nonce[:], nonce)
	copy(s.Fingerprint[:], fp)
	s.Value, s.ValidBefore = numericInt(value), numericInt(validBefore)
	s.TxNonce, s.State, s.BatchSlot = uint64(txNonce), facilitator.State(state), int(slot)
	s.TxHash, s.BlockHash = common.BytesToHash(txHash), common.BytesToHash(blockHash)
	if block != nil {
		s.BlockNumber = uint64(*block)
	}
	if reason != nil {
		s.ErrorReason = *reason
	}
	if message != nil {
		s.ErrorMessage = *message
	}
	return &s, nil
}

func numericInt(n pgtype.Numeric) *big.Int {
	if !n.Valid || n.Int == nil {
		return nil
	}
	out := new(big.Int).Set(n.Int)
	for i := int32(0); i < n.Exp; i++ {
		out.Mul(out, big.NewInt(10))
	}
	return out
}

func numeric(n *big.Int) pgtype.Numeric { return pgtype.Numeric{Int: new(big.Int).Set(n), Valid: true} }

// settlementByKeySQL reads a settlement by authorization key: the first statement of every
// settlement (and of every status and payment-identifier read), so it must stay one unique index
// probe whatever the payer's history (TestSettlementByKeyPlan; migration 0016).
const settlementByKeySQL = `-- SettlementByKey
	SELECT ` + settlementColumns + ` FROM settlements
	WHERE network = $1 AND asset = $2 AND payer = $3 AND auth_nonce = $4`

// SettlementByKey returns the settlement of an authorization.
func (db *DB) SettlementByKey(ctx context.Context, k facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	return scanSettlement(db.pool.QueryRow(ctx, settlementByKeySQL, k.Network, k.Asset[:], k.Payer[:], k.Nonce[:]))
}

// SettlementByID returns a settlement.
func (db *DB) SettlementByID(ctx context.Context, id int64) (*facilitator.Settlement, error) {
	return scanSettlement(db.pool.QueryRow(ctx, `SELECT `+settlementColumns+` FROM settlements WHERE id = $1`, id))
}

// InsertSettlement writes the row, its first transaction and its first event in one statement
// (one round trip, atomic) before anything is broadcast. The statement also checks the row's
// Guard against the ledger and writes nothing when it does not fit (limits.go): with a wallet cap
// or a key that has a gas budget, the check runs behind a transaction-scoped advisory lock on the
// wallet (and the key) taken in the same batch, so a concurrent insert for the same wallet waits
// and then counts this one.
func (db *DB) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	args, err := insertSettlementArgs(s)
	if err != nil {
		return 0, err
	}
	var (
		id              *int64
		walletOK, gasOK bool
	)
	scan := func(row pgx.Row) error { return row.Scan(&id, &walletOK, &gasOK) }
	if !guarded(s) {
		err = scan(db.pool.QueryRow(ctx, insertSettlementSQL, args...))
	} else {
		// One batch is one round trip and one implicit transaction: the locks are held until the
		// insert commits, and the insert (a later statement) reads the ledger after getting them.
		b := &pgx.Batch{}
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, limitLockTimeout)
		queueLimitLocks(b, []*facilitator.NewSettlement{s})
		b.Queue(insertSettlementSQL, args...).QueryRow(scan)
		err = db.pool.SendBatch(ctx, b).Close()
	}
	if err != nil {
		return 0, insertError(err)
	}
	if id == nil {
		return 0, db.limitRefusal(ctx, s, walletOK, gasOK)
	}
	return *id, nil
}

// guarded reports whether a row's insert checks a limit, and so runs behind advisory locks.
func guarded(s *facilitator.NewSettlement) bool { return s.Limits.WalletCapped() || s.KeyID != "" }

// queueLimitLocks queues the advisory locks that rows' guarded inserts run behind: each capped
// row's wallet lock, and each keyed row's key lock when the key has a budget (an unlimited key is
// not locked, so its settlements keep going in parallel). Each lock is taken once, and all in
// ascending order of lock key, so two transactions that need overlapping locks (a group commit
// and a single insert, or two groups on different signers) queue rather than deadlock.
func queueLimitLocks(b *pgx.Batch, rows []*facilitator.NewSettlement) {
	type keyLock struct {
		id     string
		budget *big.Int // the largest default budget among the key's rows: locked if any applies
	}
	wallets := map[int64]bool{}
	keys := map[int64]*keyLock{}
	var order []int64
	for _, s := range rows {
		if s.Limits.WalletCapped() {
			k := walletLockKey(s.Key.Network, s.Key.Asset, s.Key.Payer)
			if !wallets[k] && keys[k] == nil {
				order = append(order, k)
			}
			wallets[k] = true
		}
		if s.KeyID != "" {
			k := keyGasLockKey(s.KeyID)
			budget := orZero(s.Limits.KeyGasBudget)
			if kl := keys[k]; kl != nil {
				if budget.Cmp(kl.budget) > 0 {
					kl.budget = budget
				}
				continue
			}
			if !wallets[k] {
				order = append(order, k)
			}
			keys[k] = &keyLock{id: s.KeyID, budget: budget}
		}
	}
	slices.Sort(order)
	for _, k := range order {
		if kl := keys[k]; kl != nil && !wallets[k] {
			b.Queue(`SELECT pg_advisory_xact_lock($1) FROM api_keys WHERE id = $2 AND COALESCE(gas_budget_wei, $3) > 0`,
				k, kl.id, numeric(kl.budget))
		} else {
			b.Queue(`SELECT pg_advisory_xact_lock($1)`, k)
		}
	}
}

// InsertSettlements writes several new settlements at once, all or none. The error is the first
// row's that failed, translated as InsertSettlement's; when a row's guard refuses it, nothing is
// written and the error is facilitator.ErrGroupRefused (the caller commits the rows one by one, so
// that only the refused one fails, with its reason, and no nonce is left unused).
//
// Without guarded rows, the statements go out in one pipelined batch, which Postgres runs as one
// implicit transaction (one round trip, one commit). With any, the group runs in one explicit
// transaction: it takes every lock its rows need at once (ascending, as queueLimitLocks), then
// pipelines the inserts, then commits only if every row was inserted. The locks are held from
// before the first insert's check to the commit, so each check counts every row committed before
// it, and the group's earlier rows (the same transaction's).
func (db *DB) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	anyGuarded := false
	for _, s := range rows {
		anyGuarded = anyGuarded || guarded(s)
	}
	b := &pgx.Batch{}
	if anyGuarded {
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, limitLockTimeout)
		queueLimitLocks(b, rows)
	}
	for _, s := range rows {
		args, err := insertSettlementArgs(s)
		if err != nil {
			return nil, err
		}
		b.Queue(insertSettlementSQL, args...)
	}
	if !anyGuarded {
		ids, _, err := sendInserts(db.pool.SendBatch(ctx, b), b, len(rows))
		if err != nil {
			return nil, insertError(err)
		}
		return ids, nil
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	ids, refused, err := sendInserts(tx.SendBatch(ctx, b), b, len(rows))
	if err != nil || refused {
		// Nothing of the group stays. A rollback that fails leaves the transaction uncommitted all
		// the same (its connection is closed).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = tx.Rollback(rctx)
		cancel()
		if err != nil {
			return nil, insertError(err)
		}
		return nil, facilitator.ErrGroupRefused
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, insertError(err)
	}
	return ids, nil
}

// sendInserts reads a batch whose last n statements are settlement inserts (the ones before them
// answer nothing that matters): their ids, and whether a guard refused any of them.
func sendInserts(br pgx.BatchResults, b *pgx.Batch, n int) ([]int64, bool, error) {
	var err error
	for i := 0; i < b.Len()-n && err == nil; i++ {
		_, err = br.Exec()
	}
	ids := make([]int64, n)
	refused := false
	for i := 0; i < n && err == nil; i++ {
		var (
			id              *int64
			walletOK, gasOK bool
		)
		if err = br.QueryRow().Scan(&id, &walletOK, &gasOK); err == nil {
			if id == nil {
				refused = true
			} else {
				ids[i] = *id
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, err
	}
	return ids, refused, nil
}

func insertSettlementArgs(s *facilitator.NewSettlement) ([]any, error) {
	var scope string
	var pid *string
	var summary []byte
	var idFingerprint []byte
	if s.PaymentID != nil {
		scope, pid, idFingerprint = s.PaymentID.Scope, &s.PaymentID.ID, s.PaymentID.Fingerprint[:]
		var err error
		if summary, err = json.Marshal(s.PaymentID.Summary); err != nil {
			return nil, err
		}
	}
	g := s.Limits
	return []any{
		s.Key.Network, s.Key.Asset[:], s.Key.Payer[:], s.Key.Nonce[:], s.Fingerprint[:], s.PayTo[:],
		numeric(s.Value), numeric(s.ValidAfter), numeric(s.ValidBefore), s.X402Version, s.Request,
		s.Signer[:], int64(s.TxNonce),
		s.Tx.Hash[:], s.Tx.Raw, numeric(s.Tx.TipCap), numeric(s.Tx.FeeCap),
		signedDetail(s),
		scope, pid, summary,
		g.WalletCapped(), g.WalletWindow.Seconds(), int64(g.WalletCapCount), numeric(orZero(g.WalletCapAmount)),
		s.KeyID, numeric(orZero(g.KeyGasBudget)), numeric(orZero(s.GasReserved)),
		idFingerprint, int16(s.BatchSlot),
	}, nil
}

// signedDetail is the "signed" event's detail: the transaction, its nonce, and the slot in a batch.
func signedDetail(s *facilitator.NewSettlement) string {
	if s.BatchSlot > 0 {
		return fmt.Sprintf("tx %s nonce %d slot %d", s.Tx.Hash.Hex(), s.TxNonce, s.BatchSlot)
	}
	return fmt.Sprintf("tx %s nonce %d", s.Tx.Hash.Hex(), s.TxNonce)
}

// insertError translates the unique violations of a settlement insert.
func insertError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		switch pgErr.ConstraintName {
		case "settlements_network_signer_tx_nonce_key":
			return facilitator.ErrNonceTaken
		case "payment_ids_pkey":
			return facilitator.ErrPaymentIDTaken
		}
		return facilitator.ErrDuplicate
	}
	return err
}

// insertSettlementSQL is InsertSettlement's statement. The guard's sums are computed first (each
// off, and free, when its switch is off); the row is inserted only when both fit. Every parameter
// is cast: an INSERT ... SELECT does not take the types of its target columns.
const insertSettlementSQL = `-- InsertSettlement
	WITH w AS (
		SELECT count(*) AS n, COALESCE(sum(value), 0) AS total FROM settlements
		WHERE $22::boolean AND network = $1::text AND asset = $2::bytea AND payer = $3::bytea
			AND state IN ('signed', 'broadcast', 'mined', 'final')
			AND created_at > now() - make_interval(secs => $23::float8)),
	budget AS (
		SELECT COALESCE((SELECT gas_budget_wei FROM api_keys WHERE id = $26::text), $27::numeric) AS wei),
	used AS (
		SELECT COALESCE(sum(gas_reserved), 0) AS gas FROM settlements
		WHERE $26::text <> '' AND api_key = $26::text AND created_at > now() - interval '24 hours'),
	ok AS (
		SELECT NOT $22::boolean OR (($24::bigint = 0 OR w.n < $24::bigint)
				AND ($25::numeric = 0 OR w.total + $7::numeric <= $25::numeric)) AS wallet_ok,
			$26::text = '' OR budget.wei = 0 OR used.gas + $28::numeric <= budget.wei AS gas_ok
		FROM w, budget, used),
	s AS (
		INSERT INTO settlements (network, asset, payer, auth_nonce, fingerprint, pay_to, value, valid_after,
			valid_before, x402_version, request, signer, tx_nonce, state, api_key, gas_reserved, batch_slot)
		SELECT $1::text, $2::bytea, $3::bytea, $4::bytea, $5::bytea, $6::bytea, $7::numeric, $8::numeric,
			$9::numeric, $10::smallint, $11::bytea, $12::bytea, $13::bigint, 'signed', NULLIF($26::text, ''), $28::numeric, $30::smallint
		FROM ok WHERE wallet_ok AND gas_ok
		RETURNING id),
	-- A batch's transaction is recorded once, under slot 0 (the same statement batch writes it).
	t AS (
		INSERT INTO settlement_txs (tx_hash, settlement_id, raw, gas_tip_cap, gas_fee_cap)
		SELECT $14::bytea, id, $15::bytea, $16::numeric, $17::numeric FROM s WHERE $30::smallint = 0),
	e AS (
		INSERT INTO settlement_events (settlement_id, state, detail)
		SELECT id, 'signed', $18::text FROM s),
	p AS (
		INSERT INTO payment_ids (scope, id, fingerprint, settlement_id, summary)
		SELECT $19::text, $20::text, $29::bytea, id, $21::jsonb FROM s WHERE $20::text IS NOT NULL)
	SELECT (SELECT id FROM s), wallet_ok, gas_ok FROM ok`

// AddTx records a replacement transaction before it is sent, and raises the settlement's reserved
// gas cost to the replacement's when that is higher. A mined or final settlement takes no new
// transaction: facilitator.ErrNotFound, and nothing is written (a failed one does: its tx nonce
// may be unused, and the replacement can only revert). A transaction already recorded is
// facilitator.ErrDuplicate (an earlier AddTx of it committed and its answer was lost).
func (db *DB) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	reserved := new(big.Int).Mul(new(big.Int).SetUint64(tx.Gas), tx.FeeCap)
	var added int
	err := db.pool.QueryRow(ctx, `
		WITH o AS (SELECT id, `+familyID+` AS family FROM settlements WHERE id = $2 AND state NOT IN ('mined', 'final')),
		-- A batch's variants are recorded under its slot 0, whichever member's bump it is.
		t AS (
			INSERT INTO settlement_txs (tx_hash, settlement_id, raw, gas_tip_cap, gas_fee_cap)
			SELECT $1, family, $3, $4, $5 FROM o),
		r AS (
			UPDATE settlements SET gas_reserved = $7::numeric FROM o
			WHERE settlements.id = o.id AND $7::numeric > 0 AND gas_reserved < $7::numeric),
		e AS (
			INSERT INTO settlement_events (settlement_id, state, detail) SELECT id, 'bumped', $6 FROM o)
		SELECT count(*) FROM o`,
		tx.Hash[:], id, tx.Raw, numeric(tx.TipCap), numeric(tx.FeeCap), "replacement "+tx.Hash.Hex(), numeric(reserved)).Scan(&added)
	if err != nil {
		return insertError(err)
	}
	if added == 0 {
		return facilitator.ErrNotFound
	}
	return nil
}

// MoveNonce records a transaction re-signed with a new tx nonce (the settlement's old one was
// taken by a transaction that is not ours) and moves the settlement to that nonce, in one
// statement, before it is sent. Every earlier variant stays in settlement_txs, watched as before.
// The settlement must still be signed or broadcast (else facilitator.ErrNotFound); a nonce the
// signer's other settlement holds is facilitator.ErrNonceTaken.
func (db *DB) MoveNonce(ctx context.Context, id int64, txNonce uint64, tx facilitator.TxRecord) error {
	reserved := new(big.Int).Mul(new(big.Int).SetUint64(tx.Gas), tx.FeeCap)
	var moved int
	err := db.pool.QueryRow(ctx, `
		WITH u AS (
			UPDATE settlements SET tx_nonce = $6, gas_reserved = GREATEST(gas_reserved, NULLIF($7::numeric, 0)), updated_at = now()
			WHERE id = $2 AND state NOT IN ('mined', 'final') RETURNING id, (SELECT tx_nonce FROM settlements WHERE id = $2) AS was),
		t AS (
			INSERT INTO settlement_txs (tx_hash, settlement_id, raw, gas_tip_cap, gas_fee_cap)
			SELECT $1, id, $3, $4, $5 FROM u),
		e AS (
			INSERT INTO settlement_events (settlement_id, state, detail)
			SELECT id, 'renonced', 'tx nonce ' || was || ' left for tx ' || $8 || ' nonce ' || $6 FROM u)
		SELECT count(*) FROM u`,
		tx.Hash[:], id, tx.Raw, numeric(tx.TipCap), numeric(tx.FeeCap), int64(txNonce), numeric(reserved), tx.Hash.Hex()).Scan(&moved)
	if err != nil {
		return insertError(err)
	}
	if moved == 0 {
		return facilitator.ErrNotFound
	}
	return nil
}

// MarkBroadcast records that nodes accepted these settlements' transactions.
func (db *DB) MarkBroadcast(ctx context.Context, ids []int64) error {
	_, err := db.pool.Exec(ctx, `-- MarkBroadcast
		WITH u AS (
			UPDATE settlements SET state = 'broadcast', updated_at = now()
			WHERE id = ANY($1) AND state = 'signed' RETURNING id)
		INSERT INTO settlement_events (settlement_id, state) SELECT id, 'broadcast' FROM u`, ids)
	return err
}

// Resolve records open settlements' outcomes in one statement and returns the ids it moved: a
// settlement no longer open (another process or a job resolved it first) is left alone. A
// resolution's claim of the success is recorded in the same row update, under ClaimDelivery's
// rules (claimed: the moved ids whose claim was recorded), so a caller waiting for a mined
// outcome costs no statement, commit or row version of its own.
func (db *DB) Resolve(ctx context.Context, rs []facilitator.Resolution) ([]int64, []int64, error) {
	n := len(rs)
	ids, states, reasons, messages := make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
	hashes, blockHashes, blocks := make([][]byte, n), make([][]byte, n), make([]int64, n)
	claimKeys, claims, leases := make([]string, n), make([][]byte, n), make([]int64, n)
	for i, r := range rs {
		ids[i], states[i], reasons[i], messages[i] = r.ID, string(r.State), r.ErrorReason, r.ErrorMessage
		blocks[i] = int64(r.BlockNumber)
		// No transaction (an outcome read from the clock): NULL, not a zero hash.
		if r.TxHash != (common.Hash{}) {
			hashes[i] = r.TxHash.Bytes()
		}
		if r.BlockHash != (common.Hash{}) {
			blockHashes[i] = r.BlockHash.Bytes()
		}
		if r.Claim != nil && len(r.Claim.Token) > 0 {
			claimKeys[i], claims[i], leases[i] = r.Claim.KeyID, r.Claim.Token, r.Claim.Lease.Microseconds()
		}
	}
	rows, err := db.pool.Query(ctx, resolveSQL, ids, states, hashes, blocks, blockHashes, reasons, messages, claimKeys, claims, leases)
	if err != nil {
		return nil, nil, err
	}
	var moved, claimed []int64
	var id int64
	var got bool
	_, err = pgx.ForEachRow(rows, []any{&id, &got}, func() error {
		moved = append(moved, id)
		if got {
			claimed = append(claimed, id)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return moved, claimed, nil
}

// resolveSQL is Resolve's statement. The claim condition is ClaimDelivery's, on the outcome being
// written: mined without an error reason, no success claimed yet or the claim's lease over
// unconfirmed (a reorganised settlement keeps the one it had), and the caller's key the
// settlement's.
const resolveSQL = `-- Resolve
	WITH r AS (
		SELECT *, claim IS NOT NULL AND state IN ('mined', 'final') AND reason = '' AS claimable
		FROM unnest($1::bigint[], $2::text[], $3::bytea[], $4::bigint[], $5::bytea[], $6::text[], $7::text[], $8::text[], $9::bytea[], $10::bigint[])
			AS r(id, state, tx_hash, block_number, block_hash, reason, message, claim_key, claim, lease)),
	-- FOR UPDATE waits for a concurrent MarkBroadcast and reads the state it left, so the step
	-- below is added only when nothing recorded it.
	-- It also reads the row's claim and key as they are now, for the claim's rule.
	o AS (
		SELECT o.id, o.state AS was, r.claimable AND (o.success_delivered_at IS NULL OR o.success_lease_until < now())
			AND o.api_key IS NOT DISTINCT FROM NULLIF(r.claim_key, '') AS take
		FROM settlements o JOIN r ON r.id = o.id WHERE o.id = ANY($1) FOR UPDATE OF o),
	u AS (
		UPDATE settlements s SET state = r.state, tx_hash = r.tx_hash, block_number = NULLIF(r.block_number, 0),
			block_hash = r.block_hash, error_reason = NULLIF(r.reason, ''), error_message = NULLIF(r.message, ''),
			success_delivered_at = CASE WHEN o.take THEN now() ELSE s.success_delivered_at END,
			success_claim = CASE WHEN o.take THEN r.claim ELSE s.success_claim END,
			success_lease_until = CASE WHEN o.take THEN now() + r.lease * interval '1 microsecond' ELSE s.success_lease_until END,
			success_takeovers = s.success_takeovers + (o.take AND s.success_delivered_at IS NOT NULL)::int,
			updated_at = now()
		FROM r, o WHERE s.id = r.id AND o.id = s.id AND s.state IN ('signed', 'broadcast')
		RETURNING s.id, s.state, o.was, s.tx_hash, s.block_number, s.error_reason, o.take),
	ev AS (
	INSERT INTO settlement_events (settlement_id, state, detail)
	SELECT id, state, detail FROM (
		-- A receipt can arrive before the broadcast is recorded (a node that mines on arrival):
		-- the transaction was broadcast all the same, so its life keeps every step.
		SELECT id, 'broadcast' AS state, NULL AS detail, 0 AS step FROM u
			WHERE was = 'signed' AND state IN ('mined', 'reverted')
		UNION ALL
		SELECT id, state, COALESCE('tx 0x' || encode(tx_hash, 'hex') || ' block ' || block_number, 'no transaction of ours landed')
			|| COALESCE(' ' || error_reason, ''), 1 FROM u) e
	ORDER BY id, step)
	SELECT id, take FROM u`

// Reopen moves a mined settlement back to broadcast after a reorg took its block away;
// facilitator.ErrNotFound when the settlement is not mined in that block (any more).
func (db *DB) Reopen(ctx context.Context, m facilitator.MinedIn, detail string) error {
	var n int
	err := db.pool.QueryRow(ctx, `
		WITH u AS (
			UPDATE settlements SET state = 'broadcast', tx_hash = NULL, block_number = NULL, block_hash = NULL,
				error_reason = NULL, error_message = NULL, updated_at = now()
			WHERE id = $1 AND state = 'mined' AND block_hash IS NOT DISTINCT FROM $3 RETURNING id),
		e AS (INSERT INTO settlement_events (settlement_id, state, detail) SELECT id, 'broadcast', $2 FROM u)
		SELECT count(*) FROM u`, m.ID, detail, minedBlockHash(m)).Scan(&n)
	if err != nil {
		return err
	}
	if n == 0 {
		return facilitator.ErrNotFound
	}
	return nil
}

// minedBlockHash is the block_hash a row mined where m says has: NULL for a zero hash (rows
// recorded before block hashes were kept).
func minedBlockHash(m facilitator.MinedIn) []byte {
	if m.BlockHash == (common.Hash{}) {
		return nil
	}
	return m.BlockHash.Bytes()
}

// MarkFinal moves mined settlements to final, each only while it is still in the block judged
// final, and returns the ids it moved.
func (db *DB) MarkFinal(ctx context.Context, finals []facilitator.MinedIn) ([]int64, error) {
	ids := make([]int64, len(finals))
	hashes := make([][]byte, len(finals))
	for i, m := range finals {
		ids[i], hashes[i] = m.ID, minedBlockHash(m)
	}
	rows, err := db.pool.Query(ctx, `-- MarkFinal
		WITH u AS (
			UPDATE settlements s SET state = 'final', updated_at = now()
			FROM unnest($1::bigint[], $2::bytea[]) AS j(id, block_hash)
			WHERE s.id = j.id AND s.state = 'mined' AND s.block_hash IS NOT DISTINCT FROM j.block_hash RETURNING s.id),
		e AS (INSERT INTO settlement_events (settlement_id, state) SELECT id, 'final' FROM u)
		SELECT id FROM u`, ids, hashes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ClaimDelivery records that a caller is being told success; only one ever is, and only one
// with the key the settlement was made with: the fingerprint can be rebuilt from public calldata,
// so without that rule any caller allowed to /settle could race the merchant's retry for it. The
// claim holds the success for lease unless ConfirmDeliveries confirms it; a claim past its lease
// unconfirmed is taken over. FOR UPDATE reads the row as a concurrent claim left it, so a caller
// racing an undecided claim is told so, never that the success was answered.
func (db *DB) ClaimDelivery(ctx context.Context, id int64, keyID string, claim []byte, lease time.Duration) (bool, error) {
	var took, held bool
	err := db.pool.QueryRow(ctx, `-- ClaimDelivery
		WITH c AS (
			SELECT id, state IN ('mined', 'final') AND error_reason IS NULL AND api_key IS NOT DISTINCT FROM NULLIF($2::text, '') AS mine,
				success_delivered_at IS NULL OR success_lease_until < now() AS free, success_lease_until >= now() AS held
			FROM settlements WHERE id = $1 FOR UPDATE),
		u AS (
			UPDATE settlements s SET success_delivered_at = now(), success_claim = $3,
				success_lease_until = now() + $4::bigint * interval '1 microsecond',
				success_takeovers = s.success_takeovers + (s.success_delivered_at IS NOT NULL)::int
			FROM c WHERE s.id = c.id AND c.mine AND c.free RETURNING s.id)
		SELECT EXISTS (SELECT 1 FROM u), COALESCE((SELECT mine AND held FROM c), false)`,
		id, keyID, claim, lease.Microseconds()).Scan(&took, &held)
	switch {
	case err != nil:
		return false, err
	case !took && held:
		return false, facilitator.ErrClaimUndecided
	}
	return took, nil
}

// ConfirmDeliveries makes claims whose answers were written count for good, in one statement;
// it returns the ids whose claim was no longer the token's.
func (db *DB) ConfirmDeliveries(ctx context.Context, ds []facilitator.Delivery) ([]int64, error) {
	ids, claims := make([]int64, len(ds)), make([][]byte, len(ds))
	for i, d := range ds {
		ids[i], claims[i] = d.ID, d.Claim
	}
	rows, err := db.pool.Query(ctx, `-- ConfirmDeliveries
		WITH d AS (SELECT * FROM unnest($1::bigint[], $2::bytea[]) AS d(id, claim)),
		u AS (
			UPDATE settlements s SET success_lease_until = NULL
			FROM d WHERE s.id = d.id AND s.success_claim = d.claim RETURNING s.id)
		SELECT id FROM d WHERE id NOT IN (SELECT id FROM u)`, ids, claims)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ReleaseDelivery undoes the claim made with token claim, whose answer was not written.
func (db *DB) ReleaseDelivery(ctx context.Context, id int64, claim []byte) error {
	_, err := db.pool.Exec(ctx, `UPDATE settlements SET success_delivered_at = NULL, success_claim = NULL, success_lease_until = NULL
		WHERE id = $1 AND success_claim = $2`, id, claim)
	return err
}

// OpenSettlements lists a signer's unfinished settlements with their transactions.
func (db *DB) OpenSettlements(ctx context.Context, network string, signer common.Address) ([]facilitator.OpenSettlement, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+settlementColumns+` FROM settlements
		WHERE network = $1 AND signer = $2 AND state IN ('signed', 'broadcast', 'mined') ORDER BY tx_nonce, batch_slot`, network, signer[:])
	if err != nil {
		return nil, err
	}
	return db.withTxs(ctx, rows)
}

// ClosedFrom lists a signer's failed settlements at tx nonces from on, with their transactions.
func (db *DB) ClosedFrom(ctx context.Context, network string, signer common.Address, from uint64) ([]facilitator.OpenSettlement, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+settlementColumns+` FROM settlements
		WHERE network = $1 AND signer = $2 AND tx_nonce >= $3
			AND state IN ('reverted', 'expired', 'settled_elsewhere', 'canceled') ORDER BY tx_nonce, batch_slot`, network, signer[:], int64(from))
	if err != nil {
		return nil, err
	}
	return db.withTxs(ctx, rows)
}

// withTxs reads settlement rows and attaches every transaction each has signed.
func (db *DB) withTxs(ctx context.Context, rows pgx.Rows) ([]facilitator.OpenSettlement, error) {
	var out []facilitator.OpenSettlement
	index := map[int64]int{}
	for rows.Next() {
		s, err := scanSettlement(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		index[s.ID] = len(out)
		out = append(out, facilitator.OpenSettlement{Settlement: *s})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, nil
	}
	ids := make([]int64, 0, len(out))
	for _, o := range out {
		ids = append(ids, o.ID)
	}
	// A batch member's transactions are its family's, recorded under slot 0 (familyID).
	txRows, err := db.pool.Query(ctx, `SELECT settlements.id, t.tx_hash, t.raw, t.gas_tip_cap, t.gas_fee_cap
		FROM settlements JOIN settlement_txs t ON t.settlement_id = `+familyID+`
		WHERE settlements.id = ANY($1) ORDER BY t.created_at, t.tx_hash`, ids)
	if err != nil {
		return nil, err
	}
	defer txRows.Close()
	for txRows.Next() {
		var id int64
		var hash, raw []byte
		var tip, feeCap pgtype.Numeric
		if err := txRows.Scan(&id, &hash, &raw, &tip, &feeCap); err != nil {
			return nil, err
		}
		o := &out[index[id]]
		o.Txs = append(o.Txs, facilitator.TxRecord{Hash: common.BytesToHash(hash), Raw: raw, TipCap: numericInt(tip), FeeCap: numericInt(feeCap)})
	}
	return out, txRows.Err()
}

// NoncesHeld lists the tx nonces from on that a signer's settlements hold.
func (db *DB) NoncesHeld(ctx context.Context, network string, signer common.Address, from uint64) ([]uint64, error) {
	rows, err := db.pool.Query(ctx, `SELECT tx_nonce FROM settlements WHERE network = $1 AND signer = $2 AND tx_nonce >= $3
		ORDER BY tx_nonce`, network, signer[:], int64(from))
	if err != nil {
		return nil, err
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	out := make([]uint64, len(held))
	for i, n := range held {
		out[i] = uint64(n)
	}
	return out, err
}

// MaxTxNonce is the highest tx nonce the ledger holds for a signer.
func (db *DB) MaxTxNonce(ctx context.Context, network string, signer common.Address) (uint64, bool, error) {
	var n *int64
	if err := db.pool.QueryRow(ctx, `SELECT max(tx_nonce) FROM settlements WHERE network = $1 AND signer = $2`,
		network, signer[:]).Scan(&n); err != nil {
		return 0, false, err
	}
	if n == nil {
		return 0, false, nil
	}
	return uint64(*n), true, nil
}

// SettlementByTx returns the settlement one of whose transactions (any fee-bump variant) has hash tx.
func (db *DB) SettlementByTx(ctx context.Context, tx common.Hash) (*facilitator.Settlement, error) {
	return scanSettlement(db.pool.QueryRow(ctx, `SELECT `+settlementColumns+` FROM settlements
		WHERE id = (SELECT settlement_id FROM settlement_txs WHERE tx_hash = $1)`, tx[:]))
}

// BatchMembers lists the settlements sharing the transaction at (network, signer, txNonce), in
// slot order: one for a lone settlement, every member for a batch.
func (db *DB) BatchMembers(ctx context.Context, network string, signer common.Address, txNonce uint64) ([]facilitator.Settlement, error) {
	return db.settlements(ctx, `SELECT `+settlementColumns+` FROM settlements
		WHERE network = $1 AND signer = $2 AND tx_nonce = $3 ORDER BY batch_slot LIMIT 100`, network, signer[:], int64(txNonce))
}

// settlements runs a query of settlementColumns and scans every row.
func (db *DB) settlements(ctx context.Context, sql string, args ...any) ([]facilitator.Settlement, error) {
	rows, err := db.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []facilitator.Settlement
	for rows.Next() {
		s, err := scanSettlement(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *s)
	}
	return out, rows.Err()
}

// StaleSettlements lists a network's settlements still owed an outcome (signed, broadcast, or mined
// but not final) that nothing has updated since before, oldest first, with their transactions.
func (db *DB) StaleSettlements(ctx context.Context, network string, before time.Time, limit int) ([]facilitator.OpenSettlement, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+settlementColumns+` FROM settlements
		WHERE network = $1 AND state IN ('signed', 'broadcast', 'mined') AND updated_at < $2
		ORDER BY updated_at LIMIT $3`, network, before, limit)
	if err != nil {
		return nil, err
	}
	return db.withTxs(ctx, rows)
}

// Touch records that a settlement was looked at, so a job does not look again at once.
func (db *DB) Touch(ctx context.Context, ids []int64) error {
	_, err := db.pool.Exec(ctx, `UPDATE settlements SET updated_at = now() WHERE id = ANY($1)`, ids)
	return err
}

// TryLock takes a session advisory lock named name for as long as the returned release is not
// called; ok is false when another process holds it. Jobs use it to run once across replicas.
func (db *DB) TryLock(ctx context.Context, name string) (release func(), ok bool, err error) {
	h := fnv.New64a()
	_, _ = h.Write([]byte("x402-job:" + name))
	return db.tryLock(ctx, int64(h.Sum64()))
}

func (db *DB) tryLock(ctx context.Context, key int64) (release func(), ok bool, err error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil || !ok {
		conn.Release()
		return nil, false, err
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}, true, nil
}

// MinedBlockBelow is the highest block the ledger has one of the signer's settlements at a tx
// nonce below nonce mined in (mined or final); ok is false when it has none. A transaction of
// the key at nonce or above mined no earlier.
func (db *DB) MinedBlockBelow(ctx context.Context, network string, signer common.Address, nonce uint64) (uint64, bool, error) {
	var n *int64
	if err := db.pool.QueryRow(ctx, `SELECT max(block_number) FROM settlements
		WHERE network = $1 AND signer = $2 AND tx_nonce < $3 AND state IN ('mined', 'final')`,
		network, signer[:], int64(nonce)).Scan(&n); err != nil {
		return 0, false, err
	}
	if n == nil {
		return 0, false, nil
	}
	return uint64(*n), true, nil
}
