package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

var faultsLong = flag.Bool("faults.long", false, "TestFaultProxyLoad drives thousands of payments instead of the CI bound (or FAULTS_LONG=1)")

// proxyLoadPlan is how much TestFaultProxyLoad drives: the CI bound, or a long run on request.
type proxyLoadPlan struct {
	payments, workers int
	drive             time.Duration // the bound on driving every payment to a final answer
}

func proxyLoad() proxyLoadPlan {
	if *faultsLong || (os.Getenv("FAULTS_LONG") != "" && os.Getenv("FAULTS_LONG") != "0") {
		return proxyLoadPlan{payments: 3000, workers: 24, drive: 15 * time.Minute}
	}
	return proxyLoadPlan{payments: 240, workers: 12, drive: 75 * time.Second}
}

// The facilitator's settings under the lagging provider. Finality is deep enough that lag and
// finality interact (a lagging head is short of the depth), shallow enough for a short test. The
// fee bump comes after a few blocks, not the default 90 s, so that a receipt the provider hides
// (lagging, or null) can tempt the engine into bumping a nonce that is already mined; the
// reconcile job runs every few seconds on settlements quiet for ten, so that its terminal
// decisions (expired, settled elsewhere) are taken under the faults too.
const (
	proxyLoadFinality  = 3
	proxyLoadBumpAfter = "4s"
	// bumpGrace is how long after a block reached the node's head a fee bump of a nonce it mined
	// is still excused: the engine polls every 50 ms, and a decision is read a moment before it
	// is recorded.
	bumpGrace = time.Second
)

// TestFaultProxyLoad drives a few hundred distinct payments (half under a payment identifier)
// through the real binary whose RPC is the lagging provider (laggyRPC at providerFaults: 30 % of
// requests answered two blocks behind, 5 % of receipts null, 5 % rate-limited, 2 % answers
// dropped after the node did the work). The WebSocket head subscription is off: the engine and
// the indexer see heads only by polling through the provider. Each payment is retried honestly,
// the same payload, after the answer's Retry-After, until it has a final answer (success, or a
// terminal failure). With the provider still faulty, the audit reads anvil directly and counts:
//
//	(1) wrong final answers: a failure for a payment whose transfer happened, a success naming
//	    a transaction that did not move it (or a payment left without a final answer);
//	(2) authorizations carried by more than one mined transaction of the signer (every block's
//	    transactions, decoded);
//	(3) fee bumps of mined nonces: a 'bumped' event recorded more than bumpGrace after the block
//	    holding the signer's transaction at the replacement's nonce reached the head;
//	(4) status answers (through the faulty provider) that disagree with the chain on state,
//	    transaction or block;
//
// plus the ledger audit (auditLedger: every transfer once, ledger and chain agree). Any nonzero
// count fails. -faults.long (or FAULTS_LONG=1) drives thousands of payments.
func TestFaultProxyLoad(t *testing.T) {
	began := time.Now()
	plan := proxyLoad()
	ctx, cancel := context.WithTimeout(context.Background(), plan.drive+4*time.Minute)
	defer cancel()
	dbURL, chain := faultStack(ctx, t, "fault_proxy")
	bin := buildFacilitator(ctx, t)
	proxy, proxyURL := newLaggyRPC(t, chain.RPCURL)
	load := newFaultLoad(ctx, t, chain, 8)
	load.terminal, load.retryCap, load.limit = true, 5*time.Second, int64(plan.payments)
	env := serveEnv(t, dbURL, chain, proxyURL, load.key)
	env["FACILITATOR_LOG_LEVEL"] = "info"
	env["FACILITATOR_NETWORKS"] = withFinality(t, env["FACILITATOR_NETWORKS"], proxyLoadFinality)
	env["FACILITATOR_BUMP_AFTER"] = proxyLoadBumpAfter
	env["FACILITATOR_RECONCILE_SCHEDULE"] = "@every 5s"
	env["FACILITATOR_RECONCILE_STALE"] = "10s"
	c := startServe(ctx, t, bin, env, "facilitator") // its start-up checks go through a calm provider
	faults := providerFaults
	proxy.set(&faults)

	driveStart := time.Now()
	driveCtx, stopDriving := context.WithTimeout(ctx, plan.drive)
	load.drive(driveCtx, func() *child { return c }, plan.workers, nil).Wait()
	stopDriving()
	driven := time.Since(driveStart)

	// The audit, with the provider still faulty for the facilitator; the audit's reads go to anvil.
	a := load.auditDrive(ctx, t, dbURL, chain, c, proxy.heads)
	// The index, built through the same faulty provider (a lagging node clips its log ranges):
	// every log of the token up to its cursor, and nothing else.
	index := auditIndex(ctx, t, load.auditInput(dbURL), proxyLoadFinality, time.Minute)
	proxy.set(nil)
	c.stop(t)

	failed := map[string]int{}
	for _, p := range load.payments {
		if p.failure != "" {
			failed[p.failure]++
		}
	}
	t.Logf("fault proxy: %s (failures by reason %v); wrong answers %d, doubly-carried authorizations %d, bumps of mined nonces %d (of %d bumps), "+
		"status mismatches %d; ledger audit: %s; index: %s; ledger events %v; proxy: %s; drove for %s, took %s",
		load.summary(), failed, len(a.wrong), len(a.doubled), len(a.minedBumps), a.bumps, len(a.statuses), a.rep, index, eventCounts(ctx, t, a.conn), proxy,
		driven.Round(time.Second), time.Since(began).Round(time.Second))
	if len(a.wrong)+len(a.doubled)+len(a.minedBumps)+len(a.statuses)+a.rep.discrepancies+index.missing+index.unfounded > 0 || load.refused.Load() > 0 {
		a.evidence(ctx, t)
		t.Fatalf("under the lagging provider: %d wrong answers, %d doubly-carried authorizations, %d bumps of mined nonces, %d status mismatches, "+
			"%d ledger discrepancies, %d answers not allowed, index: %s", len(a.wrong), len(a.doubled), len(a.minedBumps), len(a.statuses), a.rep.discrepancies,
			load.refused.Load(), index)
	}
}

// loadAudit is what a fault load's audit found once the drive was over: the ledger audit, the
// payments answered wrongly, the authorizations carried by more than one mined transaction, the
// bumps of mined nonces (of bumps in all) and the status answers that disagree with the chain.
type loadAudit struct {
	rep                                  auditReport
	wrong, doubled, minedBumps, statuses []authKey
	bumps                                int
	conn                                 *pgx.Conn // to the ledger, until the test ends
}

// auditDrive audits the load's ledger and answers against the chain (its reads go to anvil), and the
// status answers of c; heads tells when each block reached the head.
func (l *faultLoad) auditDrive(ctx context.Context, t *testing.T, dbURL string, chain *devchain.Chain, c *child, heads *headWatch) loadAudit {
	t.Helper()
	a := loadAudit{rep: auditLedger(ctx, t, l.auditInput(dbURL))}
	a.wrong = l.wrongAnswers(a.rep)
	txs := minedSignerTxs(ctx, t, chain, l.signer)
	a.doubled = doublyCarried(t, txs)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	a.conn = conn
	a.bumps, a.minedBumps = bumpsOfMinedNonces(ctx, t, conn, txs, heads)
	a.statuses = l.statusMismatches(ctx, c, a.rep)
	return a
}

// evidence logs what the ledger and the chain hold of every payment the audit found wrong.
func (a loadAudit) evidence(ctx context.Context, t *testing.T) {
	evidence(ctx, t, a.conn, append(append(append(a.wrong, a.doubled...), a.statuses...), a.minedBumps...))
}

// withFinality sets every network of a FACILITATOR_NETWORKS value to depth.
func withFinality(t *testing.T, networks string, depth uint64) string {
	t.Helper()
	return editNetworks(t, networks, func(n map[string]any) { n["finality"] = depth })
}

// editNetworks applies edit to every network of a FACILITATOR_NETWORKS value.
func editNetworks(t *testing.T, networks string, edit func(n map[string]any)) string {
	t.Helper()
	var nets []map[string]any
	if err := json.Unmarshal([]byte(networks), &nets); err != nil {
		t.Fatal(err)
	}
	for _, n := range nets {
		edit(n)
	}
	out, err := json.Marshal(nets)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// signerTx is a mined transaction of the signer.
type signerTx struct {
	hash  common.Hash
	nonce uint64
	block uint64
	auths []authKey // the authorizations its calldata carries (several in a batched settlement)
}

// minedSignerTxs reads every block up to the head straight from the node and returns signer's
// transactions, with the authorization each carries decoded from its calldata.
func minedSignerTxs(ctx context.Context, t *testing.T, chain *devchain.Chain, signer common.Address) []signerTx {
	t.Helper()
	head, err := chain.Client.BlockNumber(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type rpcTx struct {
		Hash  common.Hash    `json:"hash"`
		From  common.Address `json:"from"`
		Nonce hexutil.Uint64 `json:"nonce"`
		Input hexutil.Bytes  `json:"input"`
	}
	var out []signerTx
	const chunk = 50
	for from := uint64(0); from <= head; from += chunk {
		n := min(chunk, head+1-from)
		blocks := make([]*struct {
			Number hexutil.Uint64 `json:"number"`
			Txs    []rpcTx        `json:"transactions"`
		}, n)
		elems := make([]rpc.BatchElem, n)
		for i := range elems {
			elems[i] = rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{hexutil.EncodeUint64(from + uint64(i)), true}, Result: &blocks[i]}
		}
		if err := chain.RPC.BatchCallContext(ctx, elems); err != nil {
			t.Fatalf("reading blocks from %d: %v", from, err)
		}
		for i, b := range blocks {
			if elems[i].Error != nil || b == nil {
				t.Fatalf("block %d: %v", from+uint64(i), elems[i].Error)
			}
			for _, tx := range b.Txs {
				if tx.From != signer {
					continue
				}
				st := signerTx{hash: tx.Hash, nonce: uint64(tx.Nonce), block: uint64(b.Number)}
				calls := [][]byte{tx.Input}
				if batch, ok := multicall3.DecodeAggregate3Calldata(tx.Input); ok { // a batched settlement: every call it makes
					calls = calls[:0]
					for _, c := range batch {
						calls = append(calls, c.CallData)
					}
				}
				for _, input := range calls {
					if len(input) < 4 {
						continue
					}
					if m, err := chain.USDC.ABI.MethodById(input[:4]); err == nil && strings.HasPrefix(m.Name, "transferWithAuthorization") {
						args, err := m.Inputs.Unpack(input[4:])
						if err != nil {
							t.Fatalf("decoding %s: %v", tx.Hash, err)
						}
						st.auths = append(st.auths, authKey{payer: args[0].(common.Address), nonce: common.Hash(args[5].([32]byte))})
					}
				}
				out = append(out, st)
			}
		}
	}
	return out
}

// doublyCarried returns the authorizations more than one mined transaction carries (whether the
// later ones reverted or not: each is a second settlement of one payment).
func doublyCarried(t *testing.T, txs []signerTx) []authKey {
	t.Helper()
	by := map[authKey][]signerTx{}
	for _, tx := range txs {
		for _, a := range tx.auths {
			by[a] = append(by[a], tx)
		}
	}
	var out []authKey
	for k, list := range by {
		if len(list) > 1 {
			out = append(out, k)
			var desc []string
			for _, tx := range list {
				desc = append(desc, fmt.Sprintf("%s (nonce %d, block %d)", tx.hash.Hex()[:10], tx.nonce, tx.block))
			}
			t.Errorf("authorization %s/%s is carried by %d mined transactions: %s", k.payer.Hex()[:10], k.nonce.Hex()[:10], len(list), strings.Join(desc, ", "))
		}
	}
	return out
}

// bumpsOfMinedNonces reads the ledger's fee bumps and returns those of a nonce already mined: the
// replacement's nonce (decoded from its raw transaction) was taken by the signer's transaction in
// a block that had reached the node's head (heads saw it) more than bumpGrace before the bump was
// recorded. bumps is how many fee bumps there were in all.
func bumpsOfMinedNonces(ctx context.Context, t *testing.T, conn *pgx.Conn, txs []signerTx, heads *headWatch) (bumps int, mined []authKey) {
	t.Helper()
	minedIn := map[uint64]uint64{}
	for _, tx := range txs {
		minedIn[tx.nonce] = tx.block
	}
	rows, err := conn.Query(ctx, `SELECT e.at, e.detail, s.payer, s.auth_nonce, coalesce(x.raw, ''::bytea)
		FROM settlement_events e JOIN settlements s ON s.id = e.settlement_id
		LEFT JOIN settlement_txs x ON e.detail ~ '^replacement 0x[0-9a-fA-F]{64}$'
			AND x.tx_hash = decode(substr(e.detail, length('replacement 0x') + 1), 'hex')
		WHERE e.state = 'bumped' ORDER BY e.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			at                time.Time
			detail            string
			payer, nonce, raw []byte
		)
		if err := rows.Scan(&at, &detail, &payer, &nonce, &raw); err != nil {
			t.Fatal(err)
		}
		bumps++
		var tx types.Transaction
		if err := tx.UnmarshalBinary(raw); err != nil {
			t.Errorf("fee bump %q: its replacement is not in settlement_txs as a transaction: %v", detail, err)
			continue
		}
		block, ok := minedIn[tx.Nonce()]
		if !ok {
			continue // the nonce was never mined: bumping it was the thing to do
		}
		seen, ok := heads.seenAt(block)
		if !ok || !at.After(seen.Add(bumpGrace)) {
			continue
		}
		k := authKey{payer: common.BytesToAddress(payer), nonce: common.BytesToHash(nonce)}
		mined = append(mined, k)
		t.Errorf("fee bump %s of %s/%s at tx nonce %d, recorded %s after block %d (which mined that nonce) reached the head",
			tx.Hash().Hex()[:10], k.payer.Hex()[:10], k.nonce.Hex()[:10], tx.Nonce(), at.Sub(seen).Round(time.Millisecond), block)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return bumps, mined
}

// evidence logs the ledger's story of each authorization: its row, its transactions and every
// event, for the failure report.
func evidence(ctx context.Context, t *testing.T, conn *pgx.Conn, keys []authKey) {
	t.Helper()
	seen := map[authKey]bool{}
	for _, k := range keys {
		if seen[k] || len(seen) >= 20 {
			continue
		}
		seen[k] = true
		var b strings.Builder
		fmt.Fprintf(&b, "ledger of %s/%s:", k.payer.Hex()[:10], k.nonce.Hex()[:10])
		rows, err := conn.Query(ctx, `SELECT 'row', s.id::text || ' state=' || s.state || ' tx_nonce=' || s.tx_nonce || ' tx=' || coalesce(encode(s.tx_hash, 'hex'), '-')
				|| ' block=' || coalesce(s.block_number::text, '-') || ' reason=' || coalesce(s.error_reason, '-') || ' delivered=' || (s.success_delivered_at IS NOT NULL), s.created_at
			FROM settlements s WHERE s.payer = $1 AND s.auth_nonce = $2
			UNION ALL SELECT 'tx', encode(x.tx_hash, 'hex'), x.created_at
			FROM settlement_txs x JOIN settlements s ON s.id = x.settlement_id WHERE s.payer = $1 AND s.auth_nonce = $2
			UNION ALL SELECT 'event', e.state || ' ' || coalesce(e.detail, ''), e.at
			FROM settlement_events e JOIN settlements s ON s.id = e.settlement_id WHERE s.payer = $1 AND s.auth_nonce = $2
			ORDER BY 3`, k.payer.Bytes(), k.nonce.Bytes())
		if err != nil {
			t.Logf("evidence: %v", err)
			return
		}
		for rows.Next() {
			var kind, what string
			var at time.Time
			if err := rows.Scan(&kind, &what, &at); err != nil {
				t.Logf("evidence: %v", err)
				break
			}
			fmt.Fprintf(&b, "\n  %s %-5s %s", at.Format("15:04:05.000"), kind, what)
		}
		rows.Close()
		t.Log(b.String())
	}
}

// eventCounts counts the ledger's settlement events by state, with the reopenings (a receipt seen,
// then read as gone) apart from the first broadcasts.
func eventCounts(ctx context.Context, t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT CASE WHEN state = 'broadcast' AND detail LIKE 'receipt disappeared%' THEN 'reopened' ELSE state END, count(*)
		FROM settlement_events GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			t.Fatal(err)
		}
		out[state] = n
	}
	return out
}
