package postgres

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/big"
	"time"

	"github.com/jackc/pgx/v5"
)

// Fill describes a synthetic ledger: rows shaped like a busy facilitator's (final settlements with
// their transaction, four state events, a payment id for every other one, and the indexed Transfer
// and AuthorizationUsed logs), written with COPY under a network id of their own, so that they
// grow the tables and indexes the facilitator reads without ever answering one of its lookups.
type Fill struct {
	Network string // the synthetic network id; bound to chain id 0 and a random genesis
	Rows    int    // settlements to add
	// Payers and Payees are how many distinct addresses the rows spread over.
	Payers, Payees int
	// Span is how far back the rows' times go (default 30 days).
	Span time.Duration
	// Chunk is how many settlements one transaction writes (default 50,000).
	Chunk int
	// Progress, if set, is told after each chunk.
	Progress func(done int)
}

// FillSynthetic writes f's rows. Each chunk is its own transaction: an interrupted fill leaves
// whole settlements only.
func (db *DB) FillSynthetic(ctx context.Context, f Fill) error {
	if f.Rows <= 0 || f.Network == "" {
		return fmt.Errorf("postgres: fill: a network id and a positive row count are required")
	}
	if f.Payers <= 0 {
		f.Payers = 10_000
	}
	if f.Payees <= 0 {
		f.Payees = 1_000
	}
	if f.Span <= 0 {
		f.Span = 30 * 24 * time.Hour
	}
	if f.Chunk <= 0 {
		f.Chunk = 50_000
	}
	if _, err := db.pool.Exec(ctx, `INSERT INTO networks (id, chain_id, genesis_hash) VALUES ($1, 0, $2) ON CONFLICT (id) DO NOTHING`,
		f.Network, random(32)); err != nil {
		return fmt.Errorf("postgres: fill: %w", err)
	}
	g := newFillGen(f)
	for done := 0; done < f.Rows; {
		n := min(f.Chunk, f.Rows-done)
		if err := db.fillChunk(ctx, g, n); err != nil {
			return fmt.Errorf("postgres: fill: after %d rows: %w", done, err)
		}
		done += n
		if f.Progress != nil {
			f.Progress(done)
		}
	}
	return nil
}

func (db *DB) fillChunk(ctx context.Context, g *fillGen, n int) error {
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		// Ids for the chunk's settlements, taken from the sequence at once, so that the child rows
		// can name them.
		var last int64
		if err := tx.QueryRow(ctx, `SELECT setval('settlements_id_seq', nextval('settlements_id_seq') + $1 - 1)`, n).Scan(&last); err != nil {
			return err
		}
		rows := make([]fillRow, n)
		for i := range rows {
			rows[i] = g.next(last - int64(n) + 1 + int64(i))
		}
		copyRows := func(rows []fillRow, table string, cols []string, per int, row func(r *fillRow, j int) []any) error {
			i, j := 0, 0
			_, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromFunc(func() ([]any, error) {
				if i == len(rows) {
					return nil, nil
				}
				out := row(&rows[i], j)
				if j++; j == per {
					i, j = i+1, 0
				}
				return out, nil
			}))
			return err
		}
		if err := copyRows(rows, "settlements", []string{"id", "network", "asset", "payer", "auth_nonce", "pay_to", "value", "valid_after",
			"valid_before", "x402_version", "request", "fingerprint", "signer", "tx_nonce", "state", "tx_hash", "block_number",
			"block_hash", "success_delivered_at", "created_at", "updated_at"}, 1, func(r *fillRow, _ int) []any {
			return []any{r.id, g.f.Network, g.asset, r.payer, r.nonce, r.payee, r.value, "0", r.validBefore, int16(2), g.request,
				r.fingerprint, r.signer, r.txNonce, "final", r.txHash, r.block, r.blockHash, r.at.Add(2 * time.Second), r.at, r.at.Add(time.Minute)}
		}); err != nil {
			return err
		}
		if err := copyRows(rows, "settlement_txs", []string{"tx_hash", "settlement_id", "raw", "gas_tip_cap", "gas_fee_cap", "created_at"}, 1,
			func(r *fillRow, _ int) []any {
				return []any{r.txHash, r.id, g.raw, "1000000", "2000000000", r.at}
			}); err != nil {
			return err
		}
		states := []string{"signed", "broadcast", "mined", "final"}
		if err := copyRows(rows, "settlement_events", []string{"settlement_id", "state", "at"}, len(states), func(r *fillRow, j int) []any {
			return []any{r.id, states[j], r.at.Add(time.Duration(j) * time.Second)}
		}); err != nil {
			return err
		}
		// A payment id for every other settlement, as the payment-identifier extension gives them.
		var half []fillRow
		for _, r := range rows {
			if r.id%2 == 0 {
				half = append(half, r)
			}
		}
		if err := copyRows(half, "payment_ids", []string{"scope", "id", "fingerprint", "settlement_id", "summary", "created_at"}, 1,
			func(r *fillRow, _ int) []any {
				return []any{"", fmt.Sprintf("fill_%s_%016d", g.run, r.id), r.fingerprint, r.id, g.summary, r.at}
			}); err != nil {
			return err
		}
		if err := copyRows(rows, "transfers", []string{"network", "block_number", "block_hash", "block_time", "tx_hash", "log_index", "token",
			"from_addr", "to_addr", "value"}, 1, func(r *fillRow, _ int) []any {
			return []any{g.f.Network, r.block, r.blockHash, r.at, r.txHash, int32(1), g.asset, r.payer, r.payee, r.value}
		}); err != nil {
			return err
		}
		return copyRows(rows, "authorization_events", []string{"network", "block_number", "block_hash", "block_time", "tx_hash", "log_index",
			"token", "kind", "authorizer", "nonce"}, 1, func(r *fillRow, _ int) []any {
			return []any{g.f.Network, r.block, r.blockHash, r.at, r.txHash, int32(0), g.asset, "used", r.payer, r.nonce}
		})
	})
}

type fillRow struct {
	id                         int64
	payer, payee, signer       []byte
	nonce, fingerprint, txHash []byte
	blockHash                  []byte
	value, validBefore         string
	txNonce, block             int64
	at                         time.Time
}

// fillGen makes the rows: random where the facilitator's are (nonces, hashes), drawn from fixed
// pools where a real ledger repeats itself (payers, payees, signers).
type fillGen struct {
	f                       Fill
	run                     string
	asset                   []byte
	payers, payees, signers [][]byte
	request, raw, summary   []byte
	txNonces                []int64
	start                   time.Time
	n                       int64
}

func newFillGen(f Fill) *fillGen {
	g := &fillGen{f: f, run: fmt.Sprintf("%x", random(4)), asset: random(20), start: time.Now().Add(-f.Span)}
	for range f.Payers {
		g.payers = append(g.payers, random(20))
	}
	for range f.Payees {
		g.payees = append(g.payees, random(20))
	}
	for range 4 {
		g.signers = append(g.signers, random(20))
	}
	g.txNonces = make([]int64, len(g.signers))
	// About the size of a real request and signed transaction.
	g.request = make([]byte, 1100)
	for i := range g.request {
		g.request[i] = 'a' + byte(i%26)
	}
	g.raw = random(420)
	g.summary = []byte(`{"network":"synthetic","amount":"1000","payTo":"0x0000000000000000000000000000000000000000"}`)
	return g
}

func (g *fillGen) next(id int64) fillRow {
	i := g.n
	g.n++
	s := int(i % int64(len(g.signers)))
	g.txNonces[s]++
	at := g.start.Add(time.Duration(float64(g.f.Span) * float64(i) / float64(g.f.Rows)))
	return fillRow{id: id, payer: g.payers[pick(len(g.payers))], payee: g.payees[pick(len(g.payees))], signer: g.signers[s],
		nonce: random(32), fingerprint: random(32), txHash: random(32), blockHash: random(32),
		value: big.NewInt(int64(1000 + pick(1_000_000))).String(), validBefore: fmt.Sprint(at.Unix() + 600),
		txNonce: g.txNonces[s], block: 1 + i/8, at: at}
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func pick(n int) int {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int(binary.LittleEndian.Uint64(b[:]) % uint64(n))
}
