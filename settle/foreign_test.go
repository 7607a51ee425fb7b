package settle_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/settle/settletest"
)

// TestSettleForeignNonceResigned: a transaction sent from the signer key outside the engine (a
// 0-value self-transfer at higher fees) replaces a settlement's unmined transaction in the pool
// and is mined, so the node refuses ours as nonce too low. The engine re-signs the settlement
// with a new nonce, recorded in the ledger before it is sent: the settlement is mined with the
// one transfer the authorization allows, the ledger keeps every variant and the new tx nonce, and
// the key's next settlement takes the nonce after it.
func TestSettleForeignNonceResigned(t *testing.T) {
	obs := &recordingObserver{}
	signer := env.NewSigner(t)
	addr := settletest.AddressOf(signer)
	payer := env.FundedPayer(t, 5000)
	p := env.NewPay(t, payer, 1000)
	body := p.Body(t)
	next := env.NewPay(t, payer, 2000)
	nextBody := next.Body(t)
	env.ManualMining(t)
	r := env.NewEngine(t, settletest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second,
		Config: func(c *settle.Config) {
			c.Observer = obs
			c.RebroadcastAfter = 200 * time.Millisecond
			c.RetryInterval = 200 * time.Millisecond
		}})

	ours := r.SettlePending(t, body)
	row := env.Row(t, p.Key())
	taken := row.TxNonce
	open := openRows(t, addr)[p.Key()]
	if open == nil || len(open.Txs) != 1 {
		t.Fatalf("open settlement: %+v", open)
	}

	takeNonce(t, signer, taken, open.Txs[0], ours)
	payerBefore := env.Balance(t, p.From())

	// The engine resends ours, hears nonce too low, and re-signs with a new nonce.
	for deadline := time.Now().Add(15 * time.Second); obs.count("gap "+env.Network().ID+" "+addr.Hex()+" "+settle.NonceForeign) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no foreign nonce observed; observer saw %v", obs.snapshot())
		}
	}
	env.SetAutomine(t, true)
	env.Mine(t)
	var out settle.Outcome
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out = r.MustSettle(t, body)
		if out.Response.ErrorReason != facilitator.ReasonSettlementPending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still pending: %+v", out.Response)
		}
		env.Mine(t)
	}
	if !out.Response.Success {
		t.Fatalf("after the re-sign: %+v", out.Response)
	}
	mined := common.HexToHash(out.Response.Transaction)
	if mined == ours {
		t.Fatal("the answer names the transaction the foreign one replaced")
	}
	row = env.Row(t, p.Key())
	if !row.State.Succeeded() || row.TxHash != mined || row.ErrorReason != "" {
		t.Fatalf("ledger row %+v, answer %s", row, mined)
	}
	if row.TxNonce <= taken {
		t.Fatalf("ledger tx nonce %d, want a new one past the taken %d", row.TxNonce, taken)
	}
	if got := decodeTx(t, txsOf(t, row.ID)[len(txsOf(t, row.ID))-1]).Nonce(); got != row.TxNonce {
		t.Fatalf("latest variant's nonce %d, ledger's %d", got, row.TxNonce)
	}
	if raws := txsOf(t, row.ID); len(raws) < 2 || decodeTx(t, raws[0]).Hash() != ours {
		t.Fatalf("the ledger must keep every variant, the first one first: %d", len(raws))
	}
	if rcpt := env.Receipt(t, mined); rcpt == nil || rcpt.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("the re-signed transaction's receipt: %+v", rcpt)
	}
	if got := env.Balance(t, p.PayTo); got != p.Value {
		t.Fatalf("payee holds %d, want exactly %d", got, p.Value)
	}
	if got := payerBefore - env.Balance(t, p.From()); got != p.Value {
		t.Fatalf("the payer's balance moved by %d, want exactly %d", got, p.Value)
	}
	if n := authorizationUses(t, p); n != 1 {
		t.Fatalf("%d AuthorizationUsed logs for the authorization, want 1", n)
	}
	found := false
	for _, ev := range env.Events(t, row.ID) {
		found = found || ev.State == "renonced"
	}
	if !found {
		t.Errorf("no renonced event: %v", env.Events(t, row.ID))
	}

	// The key's next settlement takes the nonce after the re-signed one, and is mined.
	out = r.MustSettle(t, nextBody)
	for deadline := time.Now().Add(15 * time.Second); out.Response.ErrorReason == facilitator.ReasonSettlementPending; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the next settlement is stuck: %+v", out.Response)
		}
		env.Mine(t)
		out = r.MustSettle(t, nextBody)
	}
	if !out.Response.Success {
		t.Fatalf("the next settlement: %+v", out.Response)
	}
	if got := env.Row(t, next.Key()).TxNonce; got != row.TxNonce+1 {
		t.Fatalf("the next settlement's tx nonce %d, want %d", got, row.TxNonce+1)
	}
	if got := env.Balance(t, next.PayTo); got != next.Value {
		t.Fatalf("the next payee holds %d, want %d", got, next.Value)
	}
	if n := nonceOf(t, addr, "latest"); n != row.TxNonce+2 {
		t.Fatalf("signer's mined nonce %d, want %d", n, row.TxNonce+2)
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
func authorizationUses(t testing.TB, p settletest.Pay) int {
	t.Helper()
	var logs []types.Log
	filter := map[string]any{"fromBlock": "0x0", "toBlock": "latest", "address": []common.Address{env.Chain.USDC.Address},
		"topics": []any{indexer.AuthorizationUsedTopic, common.BytesToHash(p.From().Bytes()), common.Hash(p.Nonce)}}
	if err := env.Chain.RPC.CallContext(context.Background(), &logs, "eth_getLogs", filter); err != nil {
		t.Fatal(err)
	}
	return len(logs)
}

// takeNonce plays the key used elsewhere: a 0-value self-transfer at nonce, paying twice our
// fees, replaces our unmined transaction in the pool (auto-mine off); then it is mined.
func takeNonce(t testing.TB, signer *ecdsa.PrivateKey, nonce uint64, ours settle.TxRecord, oursHash common.Hash) {
	t.Helper()
	addr := settletest.AddressOf(signer)
	tip := new(big.Int).Mul(ours.TipCap, big.NewInt(2))
	feeCap := new(big.Int).Mul(ours.FeeCap, big.NewInt(2))
	foreign, err := types.SignNewTx(signer, types.LatestSignerForChainID(new(big.Int).SetUint64(env.Chain.ChainID)), &types.DynamicFeeTx{
		ChainID: new(big.Int).SetUint64(env.Chain.ChainID), Nonce: nonce, GasTipCap: tip, GasFeeCap: feeCap, Gas: 21000, To: &addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Chain.Client.SendTransaction(context.Background(), foreign); err != nil {
		t.Fatalf("replacing the settlement's transaction: %v", err)
	}
	if env.InPool(t, oursHash) {
		t.Fatal("the foreign transaction did not replace ours in the pool")
	}
	env.Mine(t)
	if rcpt := env.Receipt(t, foreign.Hash()); rcpt == nil {
		t.Fatal("the foreign transaction was not mined")
	}
}

// TestSettleForeignNonceRecovered: a settlement re-signed with a new nonce (a foreign
// transaction took its first) and not mined yet when its process stops is resumed by the next
// process from the ledger: at the new nonce, with every variant, and it settles once.
func TestSettleForeignNonceRecovered(t *testing.T) {
	obs := &recordingObserver{}
	signer := env.NewSigner(t)
	addr := settletest.AddressOf(signer)
	payer := env.FundedPayer(t, 1000)
	p := env.NewPay(t, payer, 1000)
	body := p.Body(t)
	env.ManualMining(t)
	fast := func(c *settle.Config) {
		c.Observer = obs
		c.RebroadcastAfter = 200 * time.Millisecond
		c.RetryInterval = 200 * time.Millisecond
	}
	r := env.NewEngine(t, settletest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second, Config: fast})
	ours := r.SettlePending(t, body)
	taken := env.Row(t, p.Key()).TxNonce
	takeNonce(t, signer, taken, openRows(t, addr)[p.Key()].Txs[0], ours)
	for deadline := time.Now().Add(15 * time.Second); obs.count("gap "+env.Network().ID+" "+addr.Hex()+" "+settle.NonceForeign) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no foreign nonce observed; observer saw %v", obs.snapshot())
		}
	}
	r.Stop()
	env.DropPool(t) // the node lost the re-signed transaction too: only the ledger has it
	moved := openRows(t, addr)[p.Key()]
	if moved == nil || moved.TxNonce <= taken || len(moved.Txs) < 2 {
		t.Fatalf("the ledger after the re-sign: %+v", moved)
	}

	r2 := env.NewEngine(t, settletest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second, Config: fast})
	var out settle.Outcome
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		env.Mine(t)
		out = r2.MustSettle(t, body)
		if out.Response.ErrorReason != facilitator.ReasonSettlementPending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still pending after the restart: %+v", out.Response)
		}
	}
	if !out.Response.Success || common.HexToHash(out.Response.Transaction) != moved.Txs[len(moved.Txs)-1].Hash {
		t.Fatalf("after the restart: %+v, want the success of %s", out.Response, moved.Txs[len(moved.Txs)-1].Hash)
	}
	if row := env.Row(t, p.Key()); row.TxNonce != moved.TxNonce || !row.State.Succeeded() {
		t.Fatalf("ledger row %+v", row)
	}
	if got := env.Balance(t, p.PayTo); got != p.Value {
		t.Fatalf("payee holds %d, want exactly %d", got, p.Value)
	}
	if n := authorizationUses(t, p); n != 1 {
		t.Fatalf("%d AuthorizationUsed logs for the authorization, want 1", n)
	}
}
