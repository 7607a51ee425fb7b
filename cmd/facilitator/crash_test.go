package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestCrashRecovery kills the real binary with SIGKILL at each step of a settlement (through
// FACILITATOR_TEST_FAULT), restarts it on the same ledger and signer key, and has the merchant
// retry the same payload: there is never a second transfer or a second transaction, the ledger
// reaches the chain's truth, and the retrying caller is told success exactly once.
func TestCrashRecovery(t *testing.T) { testCrashRecovery(t, false) }

// TestCrashRecoveryRemoteSigner is TestCrashRecovery with the key in a real Clef (the binary
// holds only the address it lists): a remote signer changes nothing of what a crash leaves.
func TestCrashRecoveryRemoteSigner(t *testing.T) { testCrashRecovery(t, true) }

func testCrashRecovery(t *testing.T, remote bool) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	h := newCrashHarness(ctx, t)
	if remote {
		h.useClef(t)
	}
	points := []settle.FaultPoint{settle.FaultBeforeCommit, settle.FaultAfterCommit, settle.FaultAfterBroadcast, settle.FaultAfterReceipt}
	for _, point := range points {
		// The subtests share the ledger and the signer: after a failure the next would only
		// measure its leftovers.
		if !t.Run(string(point), func(t *testing.T) { h.run(ctx, t, point) }) {
			break
		}
	}
	t.Logf("crash recovery at %d fault points took %s", len(points), time.Since(began).Round(time.Millisecond))
}

// newCrashHarness builds the binary and gives it a chain, a ledger and a signer key of its own:
// nothing else on this chain moves the key's nonce. The ledger handle closes at cleanup.
func newCrashHarness(ctx context.Context, t *testing.T) *crashHarness {
	t.Helper()
	dbURL, chain := crashStack(ctx, t)
	bin := buildFacilitator(ctx, t)
	signerKey, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer := crypto.PubkeyToAddress(signerKey.PublicKey)
	if err := chain.SetBalance(ctx, signer, new(big.Int).Mul(big.NewInt(10), big.NewInt(1e18))); err != nil {
		t.Fatal(err)
	}
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return &crashHarness{key: signerKey, bin: bin, env: serveEnv(t, dbURL, chain, chain.RPCURL, signerKey), chain: chain, db: db,
		signer: signer, network: facilitator.CAIP2(chain.ChainID)}
}

// useClef moves the harness's key into a Clef: the binary gets the signer's URL, no key.
func (h *crashHarness) useClef(t *testing.T) {
	t.Helper()
	clef := stacktest.StartClef(t, h.chain.ChainID, h.key)
	delete(h.env, "FACILITATOR_SIGNER_KEYS")
	h.env["FACILITATOR_SIGNER"] = "clef:" + clef.URL
}

type crashHarness struct {
	key     *ecdsa.PrivateKey
	bin     string
	env     map[string]string
	chain   *devchain.Chain
	db      *postgres.DB
	signer  common.Address
	network string
}

// waitKeyFree waits until no process holds the signer key. A process killed at the previous fault
// point holds it through its lease session, a Postgres backend that ends a moment after the
// process does; and the process restarted after it may answer from the chain without ever taking
// the key. A process started while the backend lives finds the key held and answers 503 (seen on a
// loaded machine): that is the engine working, not the fault under test.
func (h *crashHarness) waitKeyFree(ctx context.Context, t *testing.T) {
	t.Helper()
	conn, err := pgx.Connect(ctx, h.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var migrated bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('signer_leases') IS NOT NULL`).Scan(&migrated); err != nil || !migrated {
		return // no process has run on this ledger yet
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		var held int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM signer_leases l JOIN pg_stat_activity a ON a.pid = l.session_pid
			WHERE l.network = $1 AND l.signer = $2 AND l.released_at IS NULL`, h.network, h.signer.Bytes()).Scan(&held)
		if err != nil {
			t.Fatal(err)
		}
		if held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the signer key is still held 30 s after its holder stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run crashes one settlement at point, restarts, retries, and checks the outcome.
func (h *crashHarness) run(ctx context.Context, t *testing.T, point settle.FaultPoint) {
	began := time.Now()
	chain := h.chain
	pay := h.newPayment(ctx, t, 12_345)

	payerBefore := h.balance(ctx, t, pay.payer.Address)
	payeeBefore := h.balance(ctx, t, pay.payee)
	nonceBefore := h.nonce(ctx, t, false)
	if pending := h.nonce(ctx, t, true); pending != nonceBefore {
		t.Fatalf("the signer has transactions in the pool before the test: latest %d pending %d", nonceBefore, pending)
	}

	// 1. The first process dies at the fault point while it handles /settle.
	h.waitKeyFree(ctx, t)
	first := h.start(ctx, t, "crashing process", string(point))
	res, status, err := first.settle(pay.body)
	if err == nil {
		t.Fatalf("the process set to die at %s answered %d %+v", point, status, res)
	}
	first.waitKilled(t, 15*time.Second)
	if !strings.Contains(first.logs.String(), "test fault injection is on") {
		t.Fatal("the crashing process did not log that fault injection is on")
	}

	// 2. What the crash left behind, on chain and in the ledger.
	row, err := h.db.SettlementByKey(ctx, pay.key)
	used := h.used(ctx, t, pay.payer.Address, pay.nonce)
	pendingNonce := h.nonce(ctx, t, true)
	var crashHash common.Hash
	if point == settle.FaultBeforeCommit {
		if !errors.Is(err, facilitator.ErrNotFound) {
			t.Fatalf("before-commit: the ledger has a settlement after the crash (row %+v, err %v); nothing may be written", row, err)
		}
	} else {
		if err != nil {
			t.Fatalf("%s: no ledger row after the crash: %v", point, err)
		}
		if !row.State.Open() || row.Signer != h.signer || row.TxNonce != nonceBefore {
			t.Fatalf("%s: ledger row after the crash: state %s signer %s tx nonce %d (want open, %s, %d)",
				point, row.State, row.Signer, row.TxNonce, h.signer, nonceBefore)
		}
		// The signed transaction committed with the row (an open row's tx_hash column is empty
		// until a receipt names the mined variant; the signed ones are in settlement_txs).
		open, err := h.db.OpenSettlements(ctx, h.network, h.signer)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range open {
			if o.ID == row.ID {
				if len(o.Txs) != 1 {
					t.Fatalf("%s: the crashed settlement has %d signed transactions, want 1", point, len(o.Txs))
				}
				crashHash = o.Txs[0].Hash
			}
		}
		if crashHash == (common.Hash{}) {
			t.Fatalf("%s: the crashed settlement %d is not among the signer's open settlements (%d listed)", point, row.ID, len(open))
		}
	}
	switch point {
	case settle.FaultBeforeCommit, settle.FaultAfterCommit:
		// Nothing left the process: the signer's nonce and the authorization are untouched.
		if pendingNonce != nonceBefore || used {
			t.Fatalf("%s: something reached the chain before the crash: pending nonce %d (was %d), authorization used %v",
				point, pendingNonce, nonceBefore, used)
		}
	case settle.FaultAfterBroadcast, settle.FaultAfterReceipt:
		// The one transaction reached the node (auto-mine: and was mined) before the crash.
		if pendingNonce != nonceBefore+1 {
			t.Fatalf("%s: the signer's pending nonce is %d after the crash, want %d", point, pendingNonce, nonceBefore+1)
		}
	}
	if point == settle.FaultAfterReceipt && !used {
		t.Fatal("after-receipt: the authorization is unused although the receipt was read")
	}

	// 3. Restart without the fault and retry the same payload, like a merchant whose call failed.
	second := h.start(ctx, t, "restarted process", "")
	final, attempts, pending := retryUntilSuccess(t, second, pay.body, facilitator.ReasonSettlementPending)
	hash := common.HexToHash(final.Transaction)
	if final.Network != h.network || !strings.EqualFold(final.Payer, pay.payer.Address.Hex()) || hash == (common.Hash{}) {
		t.Fatalf("success answer: %+v", final)
	}
	if crashHash != (common.Hash{}) && hash != crashHash {
		t.Fatalf("%s: the settled transaction %s is not the one committed before the crash %s (re-signed?)", point, hash, crashHash)
	}

	// 4. Exactly one transfer, one transaction, and the ledger agrees with the chain.
	if got := h.balance(ctx, t, pay.payee); new(big.Int).Sub(got, payeeBefore).Cmp(pay.value) != 0 {
		t.Fatalf("payee balance went from %s to %s, want +%s exactly once", payeeBefore, got, pay.value)
	}
	if got := h.balance(ctx, t, pay.payer.Address); new(big.Int).Sub(payerBefore, got).Cmp(pay.value) != 0 {
		t.Fatalf("payer balance went from %s to %s, want -%s exactly once", payerBefore, got, pay.value)
	}
	if !h.used(ctx, t, pay.payer.Address, pay.nonce) {
		t.Fatal("authorizationState is false after a successful settlement")
	}
	if latest, pending := h.nonce(ctx, t, false), h.nonce(ctx, t, true); latest != nonceBefore+1 || pending != latest {
		t.Fatalf("signer nonce went from %d to latest %d / pending %d, want exactly one transaction (%d)", nonceBefore, latest, pending, nonceBefore+1)
	}
	rcpt, err := chain.Client.TransactionReceipt(ctx, hash)
	if err != nil || rcpt.Status != 1 {
		t.Fatalf("receipt of the answered transaction %s: %v %+v", hash, err, rcpt)
	}
	row, err = h.db.SettlementByKey(ctx, pay.key)
	if err != nil {
		t.Fatal(err)
	}
	if !row.State.Succeeded() || row.TxHash != hash || row.BlockNumber != rcpt.BlockNumber.Uint64() ||
		row.Signer != h.signer || row.TxNonce != nonceBefore || !row.Delivered || row.ErrorReason != "" {
		t.Fatalf("ledger row after recovery: %+v; want mined/final, tx %s in block %d, tx nonce %d, delivered", row, hash, rcpt.BlockNumber, nonceBefore)
	}

	// 5. The success was delivered once: the same payload again gets no second success.
	again, status, err := second.settle(pay.body)
	if err != nil || status != http.StatusOK || again.Success || again.ErrorReason != facilitator.ReasonAlreadySettled ||
		common.HexToHash(again.Transaction) != hash {
		t.Fatalf("a repeat after the success: %d %+v %v; want already_settled with %s", status, again, err, hash)
	}
	if strings.Contains(second.logs.String(), "test fault injection") {
		t.Fatal("the restarted process has fault injection on")
	}

	second.stop(t)
	t.Logf("%s: crash left a ledger row: %v; retry answered success after %d attempt(s) (%d settlement_pending); tx %s (nonce %d) %s; %s",
		point, crashHash != (common.Hash{}), attempts, pending, hash.Hex()[:10], row.TxNonce, row.State, time.Since(began).Round(time.Millisecond))
}

// retryUntilSuccess sends body to c, as a merchant whose call failed does, until it is answered
// success (within 30 s); every other answer must be one to retry: a 5xx, or a 200 with one of the
// reasons waitable. It returns the success, the attempts and how many of them were such a 200.
func retryUntilSuccess(t *testing.T, c *child, body []byte, waitable ...string) (final facilitator.SettleResponse, attempts, waits int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		attempts++
		res, status, err := c.settle(body)
		if err != nil {
			t.Fatalf("retry %d: %v", attempts, err)
		}
		if status == http.StatusOK && res.Success {
			return res, attempts, waits
		}
		if status < 500 && (status != http.StatusOK || !slices.Contains(waitable, res.ErrorReason)) {
			t.Fatalf("retry %d: a definite answer other than success: %d %+v", attempts, status, res)
		}
		if status == http.StatusOK {
			waits++
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry %d: still no final answer after 30s: %d %+v", attempts, status, res)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// crashStack returns a fresh database and chain (see freshStack).
func crashStack(ctx context.Context, t *testing.T) (string, *devchain.Chain) {
	t.Helper()
	return freshStack(ctx, t, "crash", devchain.Options{})
}

func newAccount(t *testing.T) *devchain.Account {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &devchain.Account{Key: k, Address: crypto.PubkeyToAddress(k.PublicKey)}
}

// crashPayment is one payment a crash test settles: a fresh payer holding 1,000,000, a fresh
// payee, a random nonce, the signed /settle body and the authorization's key.
type crashPayment struct {
	payer *devchain.Account
	payee common.Address
	value *big.Int
	nonce [32]byte
	body  []byte
	key   facilitator.AuthorizationKey
}

func (h *crashHarness) newPayment(ctx context.Context, t *testing.T, value int64) crashPayment {
	t.Helper()
	payer := newAccount(t)
	if err := h.chain.USDC.Mint(ctx, payer.Address, big.NewInt(1_000_000)); err != nil {
		t.Fatal(err)
	}
	var nonce [32]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		t.Fatal(err)
	}
	pay := crashPayment{payer: payer, payee: newAccount(t).Address, value: big.NewInt(value), nonce: nonce}
	pay.body = h.payment(t, payer, pay.payee, pay.value, nonce)
	pay.key = facilitator.AuthorizationKey{Network: h.network, Asset: h.chain.USDC.Address, Payer: payer.Address, Nonce: nonce}
	return pay
}

// payment is a signed v2 /settle body, as a merchant sends it.
func (h *crashHarness) payment(t *testing.T, payer *devchain.Account, payTo common.Address, value *big.Int, nonce [32]byte) []byte {
	t.Helper()
	a := devchain.TransferAuthorization{From: payer.Address, To: payTo, Value: value,
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 600), Nonce: nonce}
	sig, err := h.chain.USDC.SignTransferAuthorization(payer.Key, a)
	if err != nil {
		t.Fatal(err)
	}
	reqs := map[string]any{"scheme": "exact", "network": h.network, "amount": value.String(), "asset": h.chain.USDC.Address.Hex(),
		"payTo": payTo.Hex(), "maxTimeoutSeconds": 60, "extra": map[string]any{"name": h.chain.USDC.Name, "version": h.chain.USDC.Version}}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentRequirements": reqs, "paymentPayload": map[string]any{
		"x402Version": 2, "accepted": reqs, "resource": map[string]any{"url": "http://merchant.test/crash"},
		"payload": map[string]any{"signature": "0x" + hex.EncodeToString(sig), "authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": value.String(), "validAfter": "0",
			"validBefore": a.ValidBefore.String(), "nonce": "0x" + hex.EncodeToString(nonce[:])}}}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func (h *crashHarness) balance(ctx context.Context, t *testing.T, addr common.Address) *big.Int {
	t.Helper()
	b, err := h.chain.USDC.BalanceOf(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (h *crashHarness) used(ctx context.Context, t *testing.T, payer common.Address, nonce [32]byte) bool {
	t.Helper()
	used, err := h.chain.USDC.AuthorizationState(ctx, payer, nonce)
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// nonce is the signer's transaction count, latest or pending.
func (h *crashHarness) nonce(ctx context.Context, t *testing.T, pending bool) uint64 {
	t.Helper()
	var n uint64
	var err error
	if pending {
		n, err = h.chain.Client.PendingNonceAt(ctx, h.signer)
	} else {
		n, err = h.chain.Client.NonceAt(ctx, h.signer, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// start runs `facilitator serve` with the harness's environment (and the fault point, if any) and
// returns once it answers /healthz.
func (h *crashHarness) start(ctx context.Context, t *testing.T, name, fault string) *child {
	t.Helper()
	env := map[string]string{}
	for k, v := range h.env {
		env[k] = v
	}
	if fault != "" {
		env["FACILITATOR_TEST_FAULT"] = fault
	}
	return startServe(ctx, t, h.bin, env, name)
}
