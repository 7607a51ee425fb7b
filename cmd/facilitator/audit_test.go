package main

import (
	"context"
	"fmt"
	"math/big"
	"sort"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The audit: after a fault test has let the facilitator recover, the ledger and the chain must
// tell the same story, with every authorization moving money at most once.

// auditInput is what the audit checks against.
type auditInput struct {
	chain    *devchain.Chain
	dbURL    string
	network  string
	signers  []common.Address
	merchant common.Address
	payers   []common.Address
	// successes are the transactions clients were answered success:true with, per authorization.
	successes map[authKey][]common.Hash
}

// authKey is one EIP-3009 authorization of the token under test.
type authKey struct {
	payer common.Address
	nonce common.Hash
}

// auditReport counts what the audit looked at. Discrepancies are also reported with t.Errorf.
type auditReport struct {
	rows, transfers, successes, discrepancies int
	// used is the chain's word on each authorization of the payers: the transactions whose
	// AuthorizationUsed it emitted; usedIn is the block of each.
	used   map[authKey][]common.Hash
	usedIn map[common.Hash]uint64
}

func (r auditReport) String() string {
	return fmt.Sprintf("%d ledger rows, %d transfers audited, %d client successes checked, %d discrepancies",
		r.rows, r.transfers, r.successes, r.discrepancies)
}

type auditRow struct {
	id        int64
	key       authKey
	payTo     common.Address
	value     *big.Int
	signer    common.Address
	txNonce   uint64
	state     facilitator.State
	txHash    common.Hash
	block     uint64
	delivered bool
	reason    string
	txs       []common.Hash
}

// auditLedger waits (up to a minute) for the ledger to hold no open settlement, then checks:
//
//	(a) every AuthorizationUsed of a payer, and every Transfer to the merchant, on chain has its
//	    ledger row, mined with that very transaction (nothing was broadcast without a row);
//	(b) no authorization has two transactions on chain: one AuthorizationUsed per (payer, nonce),
//	    at most one mined transaction per row, and each signer's on-chain nonce equals its ledger
//	    rows, whose tx nonces run 0..n-1 (no transaction of ours is missing from the ledger);
//	(c) every row in mined/final state, or with its success delivered, has its transfer on chain:
//	    a successful receipt with the Transfer payer -> payTo of the value, in the recorded block;
//	    a row that did not succeed has its authorization unused on chain;
//	(d) every success a client was answered names the transaction that moved that payment;
//
// and that the merchant's balance is the sum of the transfers audited.
func auditLedger(ctx context.Context, t *testing.T, in auditInput) auditReport {
	t.Helper()
	var rep auditReport
	bad := func(format string, args ...any) {
		t.Helper()
		rep.discrepancies++
		if rep.discrepancies <= 20 {
			t.Errorf("audit: "+format, args...)
		}
	}
	conn, err := pgx.Connect(ctx, in.dbURL)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	defer conn.Close(context.Background())

	deadline := time.Now().Add(time.Minute)
	for {
		var open int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE network = $1 AND state IN ('signed', 'broadcast')`,
			in.network).Scan(&open); err != nil {
			t.Fatalf("audit: %v", err)
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			bad("%d settlements still open a minute after the faults ended", open)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	rows := auditRows(ctx, t, conn, in.network)
	rep.rows = len(rows)
	byKey := map[authKey]*auditRow{}
	for _, r := range rows {
		if byKey[r.key] != nil {
			bad("authorization %s/%s has two ledger rows", r.key.payer.Hex()[:10], r.key.nonce.Hex()[:10])
		}
		byKey[r.key] = r
	}

	// The chain's side: AuthorizationUsed of our payers, Transfers to the merchant.
	payer := map[common.Address]bool{}
	for _, p := range in.payers {
		payer[p] = true
	}
	logs, err := in.chain.Client.FilterLogs(ctx, ethereum.FilterQuery{FromBlock: big.NewInt(0), Addresses: []common.Address{in.chain.USDC.Address},
		Topics: [][]common.Hash{{eip3009.AuthorizationUsedTopic, eip3009.TransferTopic}}})
	if err != nil {
		t.Fatalf("audit: eth_getLogs: %v", err)
	}
	used := map[authKey][]common.Hash{} // the transactions that used each authorization
	rep.used, rep.usedIn = used, map[common.Hash]uint64{}
	type transfer struct {
		from  common.Address
		value *big.Int
	}
	transfers := map[common.Hash][]transfer{} // to the merchant, by transaction
	merchantIn := new(big.Int)
	for _, l := range logs {
		if l.Removed || len(l.Topics) < 3 {
			continue
		}
		switch l.Topics[0] {
		case eip3009.AuthorizationUsedTopic:
			k := authKey{payer: common.BytesToAddress(l.Topics[1][:]), nonce: l.Topics[2]}
			if payer[k.payer] {
				used[k] = append(used[k], l.TxHash)
				rep.usedIn[l.TxHash] = l.BlockNumber
			}
		case eip3009.TransferTopic:
			if common.BytesToAddress(l.Topics[2][:]) == in.merchant {
				v := new(big.Int).SetBytes(l.Data)
				transfers[l.TxHash] = append(transfers[l.TxHash], transfer{common.BytesToAddress(l.Topics[1][:]), v})
				merchantIn.Add(merchantIn, v)
				rep.transfers++
			}
		}
	}

	// (a) and (b), from the chain's side.
	usedBy := map[common.Hash][]authKey{} // several authorizations in a batched settlement
	for k, txs := range used {
		if len(txs) != 1 {
			bad("authorization %s/%s was used %d times on chain (%v)", k.payer.Hex()[:10], k.nonce.Hex()[:10], len(txs), txs)
		}
		usedBy[txs[0]] = append(usedBy[txs[0]], k)
		r := byKey[k]
		switch {
		case r == nil:
			bad("authorization %s/%s was used on chain by %s, but the ledger has no row for it", k.payer.Hex()[:10], k.nonce.Hex()[:10], txs[0].Hex()[:10])
		case !r.state.Succeeded() || r.txHash != txs[0]:
			bad("authorization %s/%s was used on chain by %s, but its ledger row %d is %s with tx %s", k.payer.Hex()[:10], k.nonce.Hex()[:10],
				txs[0].Hex()[:10], r.id, r.state, r.txHash.Hex()[:10])
		}
	}
	for tx, ts := range transfers {
		ks, ok := usedBy[tx]
		if !ok {
			bad("transaction %s moved money to the merchant without using an authorization of our payers", tx.Hex()[:10])
			continue
		}
		// One transfer per authorization the transaction used, each from that authorization's payer.
		from := map[common.Address]int{}
		for _, k := range ks {
			from[k.payer]++
		}
		for _, tr := range ts {
			from[tr.from]--
		}
		for p, n := range from {
			if n != 0 {
				bad("transaction %s has transfers %v to the merchant, want one from each payer of %d authorizations (%s off by %d)", tx.Hex()[:10], ts, len(ks), p.Hex()[:10], -n)
			}
		}
	}

	// (b) and (c), from the ledger's side: the receipts of every transaction each row signed.
	var hashes []common.Hash
	for _, r := range rows {
		hashes = append(hashes, r.txs...)
	}
	receipts := auditReceipts(ctx, t, in.chain.RPC, hashes)
	perSigner := map[common.Address][]uint64{}
	type signedTx struct {
		signer common.Address
		nonce  uint64
		tx     common.Hash
	}
	counted := map[signedTx]bool{} // the rows of one batched settlement share its nonce: counted once
	for _, r := range rows {
		if st := (signedTx{r.signer, r.txNonce, r.txHash}); !counted[st] {
			counted[st] = true
			perSigner[r.signer] = append(perSigner[r.signer], r.txNonce)
		}
		var mined []*types.Receipt
		for _, h := range r.txs {
			if rc := receipts[h]; rc != nil {
				mined = append(mined, rc)
			}
		}
		if len(mined) > 1 {
			bad("settlement %d has %d mined transactions", r.id, len(mined))
		}
		k := r.key
		if r.state.Succeeded() || r.delivered {
			rc := receipts[r.txHash]
			switch {
			case rc == nil:
				bad("settlement %d is %s (delivered %v) with tx %s, which has no receipt", r.id, r.state, r.delivered, r.txHash.Hex()[:10])
			case rc.Status != types.ReceiptStatusSuccessful || rc.BlockNumber.Uint64() != r.block:
				bad("settlement %d: receipt of %s has status %d in block %d, ledger says block %d", r.id, r.txHash.Hex()[:10], rc.Status, rc.BlockNumber, r.block)
			case r.reason == "" && !receiptMoves(rc, in.chain.USDC.Address, k.payer, r.payTo, r.value):
				bad("settlement %d: %s does not transfer %s from %s to %s", r.id, r.txHash.Hex()[:10], r.value, k.payer.Hex()[:10], r.payTo.Hex()[:10])
			}
			if len(used[k]) == 0 {
				bad("settlement %d is %s but its authorization is unused on chain", r.id, r.state)
			}
		} else if r.state != facilitator.StateSettledElsewhere && len(used[k]) > 0 {
			bad("settlement %d is %s (%s) but its authorization was used on chain by %s", r.id, r.state, r.reason, used[k][0].Hex()[:10])
		}
	}
	for _, s := range in.signers {
		nonces := perSigner[s]
		sort.Slice(nonces, func(i, j int) bool { return nonces[i] < nonces[j] })
		latest, err := in.chain.Client.NonceAt(ctx, s, nil)
		if err != nil {
			t.Fatalf("audit: %v", err)
		}
		if latest != uint64(len(nonces)) {
			bad("signer %s: on-chain nonce %d, %d ledger rows", s.Hex()[:10], latest, len(nonces))
		}
		for i, n := range nonces {
			if n != uint64(i) {
				bad("signer %s: ledger tx nonces are not 0..%d (at %d: %d)", s.Hex()[:10], len(nonces)-1, i, n)
				break
			}
		}
	}

	// (d) what clients were told.
	for k, txs := range in.successes {
		for _, tx := range txs {
			rep.successes++
			if got := used[k]; len(got) != 1 || got[0] != tx {
				bad("a client was told success with %s for %s/%s; the chain has %v", tx.Hex()[:10], k.payer.Hex()[:10], k.nonce.Hex()[:10], got)
			}
		}
	}

	bal, err := in.chain.USDC.BalanceOf(ctx, in.merchant)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	if bal.Cmp(merchantIn) != 0 {
		bad("the merchant holds %s, the transfers audited add up to %s", bal, merchantIn)
	}
	return rep
}

func auditRows(ctx context.Context, t *testing.T, conn *pgx.Conn, network string) []*auditRow {
	t.Helper()
	rs, err := conn.Query(ctx, `SELECT s.id, s.payer, s.auth_nonce, s.pay_to, s.value::text, s.signer, s.tx_nonce, s.state,
			s.tx_hash, s.block_number, s.success_delivered_at IS NOT NULL, coalesce(s.error_reason, ''),
			coalesce((SELECT array_agg(x.tx_hash) FROM settlement_txs x WHERE x.settlement_id = s.id), '{}')
		FROM settlements s WHERE s.network = $1 ORDER BY s.id`, network)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	defer rs.Close()
	var out []*auditRow
	for rs.Next() {
		var (
			r                                   auditRow
			payer, nonce, payTo, signer, txHash []byte
			value, state                        string
			block                               *int64
			txs                                 [][]byte
		)
		if err := rs.Scan(&r.id, &payer, &nonce, &payTo, &value, &signer, &r.txNonce, &state, &txHash, &block, &r.delivered, &r.reason, &txs); err != nil {
			t.Fatalf("audit: %v", err)
		}
		r.key = authKey{common.BytesToAddress(payer), common.BytesToHash(nonce)}
		r.payTo, r.signer, r.txHash, r.state = common.BytesToAddress(payTo), common.BytesToAddress(signer), common.BytesToHash(txHash), facilitator.State(state)
		r.value, _ = new(big.Int).SetString(value, 10)
		if block != nil {
			r.block = uint64(*block)
		}
		for _, h := range txs {
			r.txs = append(r.txs, common.BytesToHash(h))
		}
		out = append(out, &r)
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("audit: %v", err)
	}
	return out
}

// auditReceipts reads the receipts of hashes straight from the node (nil: not mined).
func auditReceipts(ctx context.Context, t *testing.T, c *rpc.Client, hashes []common.Hash) map[common.Hash]*types.Receipt {
	t.Helper()
	out := map[common.Hash]*types.Receipt{}
	for i := 0; i < len(hashes); i += 200 {
		chunk := hashes[i:min(i+200, len(hashes))]
		res := make([]*types.Receipt, len(chunk))
		elems := make([]rpc.BatchElem, len(chunk))
		for j, h := range chunk {
			elems[j] = rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{h}, Result: &res[j]}
		}
		if err := c.BatchCallContext(ctx, elems); err != nil {
			t.Fatalf("audit: receipts: %v", err)
		}
		for j, h := range chunk {
			if elems[j].Error != nil {
				t.Fatalf("audit: receipt of %s: %v", h, elems[j].Error)
			}
			out[h] = res[j]
		}
	}
	return out
}

// receiptMoves reports whether rc holds token's Transfer from -> to of value.
func receiptMoves(rc *types.Receipt, token, from, to common.Address, value *big.Int) bool {
	for _, l := range rc.Logs {
		if l.Address == token && len(l.Topics) == 3 && l.Topics[0] == eip3009.TransferTopic &&
			common.BytesToAddress(l.Topics[1][:]) == from && common.BytesToAddress(l.Topics[2][:]) == to &&
			new(big.Int).SetBytes(l.Data).Cmp(value) == 0 {
			return true
		}
	}
	return false
}

// indexAudit is the block index held against the chain: every log of the token (Transfer,
// AuthorizationUsed, AuthorizationCanceled) in blocks up to the index's cursor, by block, block
// hash, transaction and log index, and nothing else.
type indexAudit struct {
	cursor             uint64
	onChain, indexed   int
	missing, unfounded int // chain logs not in the index; indexed rows the chain does not have
}

func (a indexAudit) String() string {
	return fmt.Sprintf("cursor %d, %d logs on chain, %d indexed, %d missing, %d not on chain", a.cursor, a.onChain, a.indexed, a.missing, a.unfounded)
}

// auditIndex waits (within bound) for the index's cursor to reach the chain's head at the call
// less depth (the indexer goes on through the faulty provider), then compares. A cursor that
// never gets there fails the test.
func auditIndex(ctx context.Context, t *testing.T, in auditInput, depth uint64, bound time.Duration) indexAudit {
	t.Helper()
	conn, err := pgx.Connect(ctx, in.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	head, err := in.chain.Client.BlockNumber(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target := head - min(head, depth)
	var a indexAudit
	for limit := time.Now().Add(bound); ; {
		var n int64
		err := conn.QueryRow(ctx, `SELECT number FROM index_cursors WHERE network = $1`, in.network).Scan(&n)
		if err == nil && uint64(n) >= target {
			a.cursor = uint64(n)
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("the index's cursor is %d (%v), %s after the load; want at least %d", n, err, bound, target)
		}
		time.Sleep(200 * time.Millisecond)
	}
	chainSet, indexed := map[stacktest.LogID]bool{}, map[stacktest.LogID]bool{}
	for _, id := range stacktest.ChainLogsOf(t, in.chain, a.cursor) {
		chainSet[id] = true
	}
	for _, id := range stacktest.IndexedLogsOf(ctx, t, conn, in.network, a.cursor) {
		indexed[id] = true
	}
	a.onChain, a.indexed = len(chainSet), len(indexed)
	for id := range chainSet {
		if !indexed[id] {
			a.missing++
		}
	}
	for id := range indexed {
		if !chainSet[id] {
			a.unfounded++
		}
	}
	return a
}
