package settle_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// TestSettleForeignNonceResigned: a transaction sent from the signer key outside the engine (a
// 0-value self-transfer at higher fees) replaces a settlement's unmined transaction in the pool
// and is mined, so the node refuses ours as nonce too low. The engine re-signs the settlement
// with a new nonce, recorded in the ledger before it is sent: the settlement is mined with the
// one transfer the authorization allows, the ledger keeps every variant and the new tx nonce, and
// the key's next settlement takes the nonce after it.
func TestSettleForeignNonceResigned(t *testing.T) {
	payer := env.FundedPayer(t, 5000)
	p := env.NewPay(t, payer, 1000)
	next := env.NewPay(t, payer, 2000)
	d := displace(t, p)
	d.mineForeign(t)

	// The engine resends ours, hears nonce too low, and re-signs with a new nonce.
	d.obs.await(t, gap(d.addr, settle.NonceForeign), 1, 15*time.Second)
	env.SetAutomine(t, true)
	env.Mine(t)
	out := settledPastPending(t, d.r, d.body, "after the re-sign")
	if !out.Response.Success {
		t.Fatalf("after the re-sign: %+v", out.Response)
	}
	mined := common.HexToHash(out.Response.Transaction)
	if mined == d.ours {
		t.Fatal("the answer names the transaction the foreign one replaced")
	}
	row := env.Row(t, p.Key())
	if !row.State.Succeeded() || row.TxHash != mined || row.ErrorReason != "" {
		t.Fatalf("ledger row %+v, answer %s", row, mined)
	}
	if row.TxNonce <= d.taken {
		t.Fatalf("ledger tx nonce %d, want a new one past the taken %d", row.TxNonce, d.taken)
	}
	if got := decodeTx(t, txsOf(t, row.ID)[len(txsOf(t, row.ID))-1]).Nonce(); got != row.TxNonce {
		t.Fatalf("latest variant's nonce %d, ledger's %d", got, row.TxNonce)
	}
	if raws := txsOf(t, row.ID); len(raws) < 2 || decodeTx(t, raws[0]).Hash() != d.ours {
		t.Fatalf("the ledger must keep every variant, the first one first: %d", len(raws))
	}
	if rcpt := env.Receipt(t, mined); rcpt == nil || rcpt.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("the re-signed transaction's receipt: %+v", rcpt)
	}
	d.paid(t, 1, p.Value)
	found := false
	for _, ev := range env.Events(t, row.ID) {
		found = found || ev.State == "renonced"
	}
	if !found {
		t.Errorf("no renonced event: %v", env.Events(t, row.ID))
	}

	// The key's next settlement takes the nonce after the re-signed one, and is mined.
	nextSettles(t, d.r, next, row.TxNonce)
}

// resendingEngine is an engine on signer alone, reporting to obs, that answers pending after a
// second and resends and retries every 200 ms: it hears nonce too low soon after a foreign
// transaction takes its settlement's nonce.
func resendingEngine(t *testing.T, signer *ecdsa.PrivateKey, obs *recordingObserver) *stacktest.Engine {
	return env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second,
		Config: func(c *settle.Config) {
			c.Observer = obs
			c.RebroadcastAfter = 200 * time.Millisecond
			c.RetryInterval = 200 * time.Millisecond
		}})
}

// settledPastPending asks r to settle body until it answers other than pending, mining a block
// between the asks, for up to 20 s; what names the answer awaited when it fails.
func settledPastPending(t *testing.T, r *stacktest.Engine, body []byte, what string) facilitator.SettleOutcome {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out := r.MustSettle(t, body)
		if out.Response.ErrorReason != facilitator.ReasonSettlementPending {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still pending: %+v", what, out.Response)
		}
		env.Mine(t)
	}
}

// nextSettles checks that the key's next settlement takes the nonce after taken and is mined:
// the key's mined nonce is then taken+2.
func nextSettles(t *testing.T, r *stacktest.Engine, next stacktest.Pay, taken uint64) {
	t.Helper()
	if out := settledPastPending(t, r, next.Body(t), "the next settlement"); !out.Response.Success {
		t.Fatalf("the next settlement: %+v", out.Response)
	}
	if got := env.Row(t, next.Key()).TxNonce; got != taken+1 {
		t.Fatalf("the next settlement's tx nonce %d, want %d", got, taken+1)
	}
	if got := env.Balance(t, next.PayTo); got != next.Value {
		t.Fatalf("the next payee holds %d, want %d", got, next.Value)
	}
	if n := nonceOf(t, stacktest.AddressOf(r.Signer()), "latest"); n != taken+2 {
		t.Fatalf("signer's mined nonce %d, want %d", n, taken+2)
	}
}

// txsOf is every signed variant of a settlement, in the order recorded.
func txsOf(t testing.TB, id int64) [][]byte {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), `SELECT raw FROM settlement_txs WHERE settlement_id = $1 ORDER BY created_at, tx_hash`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			t.Fatal(err)
		}
		out = append(out, raw)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// authorizationUses counts the chain's AuthorizationUsed logs for p's authorization.
func authorizationUses(t testing.TB, p stacktest.Pay) int {
	t.Helper()
	var logs []types.Log
	filter := map[string]any{"fromBlock": "0x0", "toBlock": "latest", "address": []common.Address{env.Chain.USDC.Address},
		"topics": []any{eip3009.AuthorizationUsedTopic, common.BytesToHash(p.From().Bytes()), common.Hash(p.Nonce)}}
	if err := env.Chain.RPC.CallContext(context.Background(), &logs, "eth_getLogs", filter); err != nil {
		t.Fatal(err)
	}
	return len(logs)
}

// replaceNonce plays the key used elsewhere: a 0-value self-transfer at nonce, paying twice our
// fees, replaces our unmined transaction in the pool (auto-mine off); its hash is returned.
func replaceNonce(t testing.TB, signer *ecdsa.PrivateKey, nonce uint64, ours facilitator.TxRecord, oursHash common.Hash) common.Hash {
	t.Helper()
	foreign := sendSelfTransfer(t, signer, nonce, new(big.Int).Mul(ours.TipCap, big.NewInt(2)), new(big.Int).Mul(ours.FeeCap, big.NewInt(2)))
	if env.InPool(t, oursHash) {
		t.Fatal("the foreign transaction did not replace ours in the pool")
	}
	return foreign
}

// sendSelfTransfer sends, from signer's key outside the engine, a 0-value transfer to itself at
// nonce with the fees given, and returns its hash.
func sendSelfTransfer(t testing.TB, signer *ecdsa.PrivateKey, nonce uint64, tip, feeCap *big.Int) common.Hash {
	t.Helper()
	addr := stacktest.AddressOf(signer)
	chainID := new(big.Int).SetUint64(env.Chain.ChainID)
	tx, err := types.SignNewTx(signer, types.LatestSignerForChainID(chainID), &types.DynamicFeeTx{
		ChainID: chainID, Nonce: nonce, GasTipCap: tip, GasFeeCap: feeCap, Gas: 21000, To: &addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Chain.Client.SendTransaction(context.Background(), tx); err != nil {
		t.Fatalf("sending a self-transfer at nonce %d: %v", nonce, err)
	}
	return tx.Hash()
}

// TestSettleForeignNonceRecovered: a settlement re-signed with a new nonce (a foreign
// transaction took its first) and not mined yet when its process stops is resumed by the next
// process from the ledger: at the new nonce, with every variant, and it settles once.
func TestSettleForeignNonceRecovered(t *testing.T) {
	p := env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	d := displace(t, p)
	d.mineForeign(t)
	d.obs.await(t, gap(d.addr, settle.NonceForeign), 1, 15*time.Second)
	d.r.Stop(context.Background())
	env.DropPool(t) // the node lost the re-signed transaction too: only the ledger has it
	moved := openRows(t, d.addr)[p.Key()]
	if moved == nil || moved.TxNonce <= d.taken || len(moved.Txs) < 2 {
		t.Fatalf("the ledger after the re-sign: %+v", moved)
	}

	r2 := resendingEngine(t, d.signer, d.obs)
	env.Mine(t)
	out := settledPastPending(t, r2, d.body, "after the restart")
	if !out.Response.Success || common.HexToHash(out.Response.Transaction) != moved.Txs[len(moved.Txs)-1].Hash {
		t.Fatalf("after the restart: %+v, want the success of %s", out.Response, moved.Txs[len(moved.Txs)-1].Hash)
	}
	if row := env.Row(t, p.Key()); row.TxNonce != moved.TxNonce || !row.State.Succeeded() {
		t.Fatalf("ledger row %+v", row)
	}
	d.paid(t, 1, p.Value)
}

// displaced is a settlement whose unmined transaction a foreign transaction (the signer key used
// elsewhere) replaced in the pool, not mined yet (mineForeign mines it alone; a test may mine it
// beside something else): auto-mine is off, and the engine rebroadcasts fast, so it hears nonce
// too low soon after the foreign transaction is mined.
type displaced struct {
	r       *stacktest.Engine
	obs     *recordingObserver
	signer  *ecdsa.PrivateKey
	addr    common.Address
	p       stacktest.Pay
	body    []byte
	ours    common.Hash // the settlement's one transaction
	taken   uint64      // its tx nonce, which the foreign transaction holds
	foreign common.Hash
	payer   int64 // the payer's balance before
}

// displace settles p with mining off and replaces its transaction with a foreign one at the
// same nonce (unmined).
func displace(t *testing.T, p stacktest.Pay) *displaced {
	t.Helper()
	d := &displaced{obs: &recordingObserver{}, p: p, body: p.Body(t)}
	d.signer = env.NewSigner(t)
	d.addr = stacktest.AddressOf(d.signer)
	env.ManualMining(t)
	d.r = resendingEngine(t, d.signer, d.obs)
	d.ours = d.r.SettlePending(t, d.body)
	d.taken = env.Row(t, p.Key()).TxNonce
	open := openRows(t, d.addr)[p.Key()]
	if open == nil || len(open.Txs) != 1 {
		t.Fatalf("open settlement: %+v", open)
	}
	d.payer = env.Balance(t, p.From())
	d.foreign = replaceNonce(t, d.signer, d.taken, open.Txs[0], d.ours)
	return d
}

// mineForeign mines the foreign transaction: the node now calls ours nonce too low.
func (d *displaced) mineForeign(t *testing.T) {
	t.Helper()
	env.Mine(t)
	if rcpt := env.Receipt(t, d.foreign); rcpt == nil {
		t.Fatal("the foreign transaction was not mined")
	}
}

// paid checks the chain's story of the payment: its authorization used uses times, and value
// moved from the payer to the payee since it was displaced.
func (d *displaced) paid(t *testing.T, uses int, value int64) {
	t.Helper()
	if n := authorizationUses(t, d.p); n != uses {
		t.Fatalf("%d AuthorizationUsed logs for the authorization, want %d", n, uses)
	}
	if got := env.Balance(t, d.p.PayTo); got != value {
		t.Fatalf("payee holds %d, want exactly %d", got, value)
	}
	if got := d.payer - env.Balance(t, d.p.From()); got != value {
		t.Fatalf("the payer's balance moved by %d, want exactly %d", got, value)
	}
}

// resolved waits for the settlement to leave the open states and returns its row.
func (d *displaced) resolved(t *testing.T) *facilitator.Settlement {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		row := env.Row(t, d.p.Key())
		if !row.State.Open() {
			return row
		}
		if time.Now().After(deadline) {
			t.Fatalf("still open: %+v; observer saw %v", row, d.obs.snapshot())
		}
	}
}

// heardTooLow waits until a node called the settlement's transaction nonce too low n more times
// (each one makes the next watcher round run the foreign-nonce check).
func (d *displaced) heardTooLow(t *testing.T, n int) {
	t.Helper()
	key := gap(d.addr, settle.NonceUsed)
	d.obs.await(t, key, d.obs.count(key)+n, 15*time.Second)
}

// notResigned checks that the settlement kept its one transaction at the taken nonce: no
// variant at a new nonce, no renonced event, no foreign re-sign reported.
func (d *displaced) notResigned(t *testing.T, id int64) {
	t.Helper()
	if raws := txsOf(t, id); len(raws) != 1 || decodeTx(t, raws[0]).Hash() != d.ours {
		t.Errorf("the settlement has %d variants, want only its first %s", len(raws), d.ours)
	}
	for _, ev := range env.Events(t, id) {
		if ev.State == "renonced" {
			t.Errorf("renonced event: %v", env.Events(t, id))
		}
	}
	if n := d.obs.count(gap(d.addr, settle.NonceForeign)); n != 0 {
		t.Errorf("%d foreign re-signs reported", n)
	}
	if got := env.Row(t, d.p.Key()).TxNonce; got != d.taken {
		t.Errorf("ledger tx nonce %d, want the taken %d kept", got, d.taken)
	}
}

// TestSettleForeignNonceUsedElsewhere: a foreign transaction takes a settlement's nonce, and a
// third party submits the same authorization, both mined in one block before the engine can
// re-sign. The engine hears nonce too low, finds no receipt of ours and the authorization used:
// the settlement is settled_elsewhere, never re-signed, and the one transfer is the third
// party's. The status API names that transfer once the index has it, as for the other paths
// that resolve settled_elsewhere.
func TestSettleForeignNonceUsedElsewhere(t *testing.T) {
	payer := env.FundedPayer(t, 3000)
	p := env.NewPay(t, payer, 1000)
	next := env.NewPay(t, payer, 2000)
	d := displace(t, p)
	elsewhere := p.SendElsewhere(t)
	env.Mine(t)
	fr, er := env.Receipt(t, d.foreign), env.Receipt(t, elsewhere)
	if fr == nil || er == nil || er.Status != types.ReceiptStatusSuccessful || fr.BlockNumber.Cmp(er.BlockNumber) != 0 {
		t.Fatalf("want the foreign transaction and the third party's transfer mined in one block: %+v, %+v", fr, er)
	}

	row := d.resolved(t)
	if row.State != facilitator.StateSettledElsewhere || row.ErrorReason != facilitator.ReasonNonceAlreadyUsed {
		t.Fatalf("ledger row %+v, want settled_elsewhere / %s", row, facilitator.ReasonNonceAlreadyUsed)
	}
	// The foreign-nonce check's resolution, not a receipt's (none of ours exists).
	if row.ErrorMessage != "the authorization was used by a transaction that is not ours" {
		t.Errorf("error message %q", row.ErrorMessage)
	}
	if env.Receipt(t, d.ours) != nil {
		t.Fatal("our transaction has a receipt")
	}
	d.notResigned(t, row.ID)
	d.paid(t, 1, p.Value)
	out := d.r.MustSettle(t, d.body)
	if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonNonceAlreadyUsed || out.Response.Transaction != "" {
		t.Fatalf("the answer after: %+v", out.Response)
	}

	// Status: the ledger row names no transaction (none of ours landed); the index names the
	// third party's, as it does for a row the watcher or reconcile resolved settled_elsewhere.
	svc := status.New(env.DB, []status.Network{{Network: env.Network(), Head: env.Chain.RPC}}, nil)
	env.StartIndexer(t)
	env.WaitIndexed(t, er.BlockNumber.Uint64())
	st, found, err := svc.Authorization(context.Background(), p.Key())
	if err != nil || !found {
		t.Fatalf("status: found %v, err %v", found, err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Transaction != elsewhere.Hex() ||
		st.BlockNumber != er.BlockNumber.Uint64() || st.Basis != "ledger+index" {
		t.Fatalf("status %+v, want settled by other in %s at block %d", st, elsewhere, er.BlockNumber)
	}

	nextSettles(t, d.r, next, d.taken)
	d.notResigned(t, row.ID)
}

// TestSettleForeignNonceExpired: a foreign transaction takes a settlement's nonce in a block
// less than resignMargin (30 s) before validBefore: the engine leaves it (no re-sign, still
// open). Once a block reaches validBefore with the authorization unused, the settlement is
// expired: no transfer, never re-signed, and the key's next settlement still works.
func TestSettleForeignNonceExpired(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 3000)
	p := env.NewPay(t, payer, 1000)
	p.ValidBefore = big.NewInt(env.TimeBase(t) + 120)
	vb := p.ValidBefore.Uint64()
	d := displace(t, p)

	// Mined 10 s before validBefore by the chain's clock: within the margin.
	if err := env.Chain.SetNextBlockTimestamp(ctx, vb-10); err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	if rcpt := env.Receipt(t, d.foreign); rcpt == nil {
		t.Fatal("the foreign transaction was not mined")
	}
	d.heardTooLow(t, 3)
	if row := env.Row(t, p.Key()); !row.State.Open() {
		t.Fatalf("within the margin: ledger row %+v, want it left open", row)
	}
	d.notResigned(t, env.Row(t, p.Key()).ID)

	// A block at validBefore: expired.
	if err := env.Chain.SetNextBlockTimestamp(ctx, vb); err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	row := d.resolved(t)
	if row.State != facilitator.StateExpired || row.ErrorReason != facilitator.ReasonValidBefore ||
		!strings.Contains(row.ErrorMessage, "not ours") {
		t.Fatalf("ledger row %+v, want expired / %s from the foreign-nonce check", row, facilitator.ReasonValidBefore)
	}
	d.notResigned(t, row.ID)
	d.paid(t, 0, 0)
	out := d.r.MustSettle(t, d.body)
	if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonValidBefore {
		t.Fatalf("the answer after: %+v", out.Response)
	}

	nextSettles(t, d.r, env.NewPay(t, payer, 2000), d.taken) // valid from the chain's clock, now past vb
	d.notResigned(t, row.ID)
}
