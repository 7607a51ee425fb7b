package paymentid_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestReplay: a payment settled under an id, sent again with the same id and request, gets the
// same success (same transaction, marked as a replay) from the stored answer, and nothing is
// sent; /verify of it is valid (a replay) although its nonce is used on chain. Without an id the
// same repeat is already_settled, as before.
func TestReplay(t *testing.T) {
	r := newRig(t, rigOptions{})
	url := r.url
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000_000)
	p := newPay(t, payer, 250_000)
	body := p.Body(t)

	out, err := r.settle(t, body)
	if err != nil {
		t.Fatal(err)
	}
	res := out.Response
	if !res.Success || res.Transaction == "" || !out.Claimed || res.Payer != p.From().Hex() || replayID(res.Extensions) != "" {
		t.Fatalf("first settle: %+v (claimed %v)", res, out.Claimed)
	}
	tx := res.Transaction
	rec := r.record(t, p.ID)
	// Bound to the payment and its resource (IDFingerprint), no longer to the settlement's
	// fingerprint alone, which leaves the resource out.
	if rec.Settlement == nil || rec.Settlement.ID != out.SettlementID || rec.Fingerprint != stacktest.Decode(t, body).IDFingerprint() {
		t.Fatalf("id record %+v, want bound to settlement %d with the request's id fingerprint", rec, out.SettlementID)
	}
	if rec.Response == nil || time.Until(rec.ResponseExpires) < 23*time.Hour {
		t.Fatalf("stored answer %q until %s, want one kept for the 24 h window", rec.Response, rec.ResponseExpires)
	}
	if rec.Summary["from"] != p.From().Hex() || rec.Summary["amount"] != "250000" || rec.Summary["payTo"] != p.PayTo.Hex() ||
		rec.Summary["resource"] != p.Resource {
		t.Fatalf("stored summary %v", rec.Summary)
	}
	sent := r.nonces(t)
	if sent != [2]uint64{1, 1} {
		t.Fatalf("signer nonces %v after one settlement", sent)
	}
	calls := r.engine.calls.Load()

	again, err := r.settle(t, body)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Response.Success || again.Response.Transaction != tx || again.Response.ErrorReason != "" || again.Claimed ||
		again.SettlementID != out.SettlementID || replayID(again.Response.Extensions) != p.ID {
		t.Fatalf("replay: %+v (claimed %v, settlement %d); want success with %s marked as a replay of %s",
			again.Response, again.Claimed, again.SettlementID, tx, p.ID)
	}
	if again.Response.Network != env.Network().ID || again.Response.Payer != p.From().Hex() {
		t.Fatalf("replay network/payer: %+v", again.Response)
	}
	if got := r.engine.calls.Load() - calls; got != 0 {
		t.Fatalf("a replay within the window called the engine %d times; want the stored answer", got)
	}

	// The same payment spelled differently is the same request. (Another resource text used to be a
	// mere spelling too; it no longer is: ids are bound to the resource, see TestConflictResource.)
	respelled := []byte(strings.ReplaceAll(string(body), p.PayTo.Hex(), strings.ToLower(p.PayTo.Hex())))
	if string(respelled) == string(body) {
		t.Fatal("test edit did not apply")
	}
	if out, err := r.settle(t, respelled); err != nil || !out.Response.Success || out.Response.Transaction != tx || !facilitator.IsReplay(out.Response.Extensions) {
		t.Fatalf("replay of the request spelled differently: %+v %v", out.Response, err)
	}

	// /verify: valid, a replay, although the authorization is used on chain.
	vres, err := r.verify(t, body)
	if err != nil {
		t.Fatal(err)
	}
	if !vres.IsValid || vres.InvalidReason != "" || vres.Payer != p.From().Hex() || replayID(vres.Extensions) != p.ID {
		t.Fatalf("verify of a settled id: %+v", vres)
	}
	plain, err := r.verifier.Verify(ctx, stacktest.Decode(t, body))
	if err != nil || plain.IsValid || plain.InvalidReason != facilitator.ReasonNonceAlreadyUsed {
		t.Fatalf("the plain verifier on the settled payment: %+v %v; want %s (the case the replay covers)", plain, err, facilitator.ReasonNonceAlreadyUsed)
	}

	// Over HTTP: 200, the replay header and the official packages' EXTENSION-RESPONSES.
	for _, path := range []string{"/settle", "/verify"} {
		hr := post(t, url+path, body)
		if hr.Status != http.StatusOK || hr.Header.Get(facilitator.ReplayHeader) != "true" || hr.Header.Get("Retry-After") != "" {
			t.Fatalf("%s replay over HTTP: %d %v %s", path, hr.Status, hr.Header, hr.Body)
		}
		raw, err := base64.StdEncoding.DecodeString(hr.Header.Get("EXTENSION-RESPONSES"))
		var ext map[string]any
		if err != nil || json.Unmarshal(raw, &ext) != nil || replayID(ext) != p.ID {
			t.Fatalf("%s EXTENSION-RESPONSES %q: %v", path, hr.Header.Get("EXTENSION-RESPONSES"), err)
		}
		if path == "/settle" {
			if sr := hr.settle(t); !sr.Success || sr.Transaction != tx || replayID(sr.Extensions) != p.ID {
				t.Fatalf("/settle replay body: %s", hr.Body)
			}
		} else if vr := hr.verify(t); !vr.IsValid || replayID(vr.Extensions) != p.ID {
			t.Fatalf("/verify replay body: %s", hr.Body)
		}
	}
	if n := r.nonces(t); n != sent {
		t.Fatalf("signer nonces %v -> %v: a replay sent something", sent, n)
	}
	if got := env.Balance(t, p.PayTo); got != 250_000 {
		t.Fatalf("payee holds %d, want 250000 once", got)
	}

	// No id: invariant 4 as before, and nothing is marked as a replay.
	q := newPay(t, payer, 100_000)
	q.ID = ""
	qbody := q.Body(t)
	first, err := r.settle(t, qbody)
	if err != nil || !first.Response.Success {
		t.Fatalf("settle without an id: %+v %v", first.Response, err)
	}
	repeat, err := r.settle(t, qbody)
	if err != nil {
		t.Fatal(err)
	}
	if repeat.Response.Success || repeat.Response.ErrorReason != facilitator.ReasonAlreadySettled ||
		repeat.Response.Transaction != first.Response.Transaction || repeat.Response.Extensions != nil {
		t.Fatalf("repeat without an id: %+v; want already_settled with %s and no extensions", repeat.Response, first.Response.Transaction)
	}
	hr := post(t, url+"/settle", qbody)
	if hr.Header.Get(facilitator.ReplayHeader) != "" || hr.settle(t).ErrorReason != facilitator.ReasonAlreadySettled {
		t.Fatalf("HTTP repeat without an id: %v %s", hr.Header, hr.Body)
	}
	if v, err := r.verify(t, qbody); err != nil || v.IsValid || v.InvalidReason != facilitator.ReasonNonceAlreadyUsed || v.Extensions != nil {
		t.Fatalf("verify without an id after settling: %+v %v", v, err)
	}
	if conflicts, replays := r.svc.Counts(); conflicts != 0 || replays < 5 {
		t.Fatalf("counts: %d conflicts, %d replays", conflicts, replays)
	}
}

// TestConflict: an id reused with another payment (another amount, payee or payer, each a valid
// authorization of its own) is payment_identifier_conflict (409 over HTTP) naming what differs,
// from /settle and /verify, and nothing is sent, paid or written for it.
func TestConflict(t *testing.T) {
	r := newRig(t, rigOptions{})
	url := r.url
	ctx := context.Background()
	cases := []struct {
		name    string
		edit    func(t *testing.T, first stacktest.Pay) stacktest.Pay
		differs []string
	}{
		{"amount", func(t *testing.T, f stacktest.Pay) stacktest.Pay {
			f.Nonce, f.Value = stacktest.Random32(t), f.Value+1
			return f
		}, []string{"amount", "value"}},
		{"payTo", func(t *testing.T, f stacktest.Pay) stacktest.Pay {
			f.Nonce, f.PayTo = stacktest.Random32(t), stacktest.NewAddress(t)
			return f
		}, []string{"payTo", "to"}},
		{"payer", func(t *testing.T, f stacktest.Pay) stacktest.Pay {
			f.Nonce, f.Payer = stacktest.Random32(t), env.FundedPayer(t, 1_000_000)
			return f
		}, []string{"from"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			first := newPay(t, env.FundedPayer(t, 1_000_000), 100_000)
			out, err := r.settle(t, first.Body(t))
			if err != nil || !out.Response.Success {
				t.Fatalf("first settle: %+v %v", out.Response, err)
			}
			second := tc.edit(t, first)
			body := second.Body(t)
			if v, err := r.verifier.Verify(ctx, stacktest.Decode(t, body)); err != nil || !v.IsValid {
				t.Fatalf("the second payment is not valid on its own: %+v %v", v, err)
			}
			before := r.nonces(t)
			payerBefore, payeeBefore := env.Balance(t, second.From()), env.Balance(t, second.PayTo)

			_, err = r.settle(t, body)
			checkConflict(t, "settle", err, tc.differs)
			_, err = r.verify(t, body)
			checkConflict(t, "verify", err, tc.differs)
			for _, path := range []string{"/settle", "/verify"} {
				hr := post(t, url+path, body)
				if hr.Status != http.StatusConflict || hr.Header.Get(facilitator.ReplayHeader) != "" {
					t.Fatalf("%s: want 409, got %d %s", path, hr.Status, hr.Body)
				}
				if path == "/settle" {
					sr := hr.settle(t)
					if sr.Success || sr.ErrorReason != facilitator.ReasonPaymentIdentifierConflict || sr.Transaction != "" || sr.Network != env.Network().ID {
						t.Fatalf("/settle conflict body: %s", hr.Body)
					}
				} else if vr := hr.verify(t); vr.IsValid || vr.InvalidReason != facilitator.ReasonPaymentIdentifierConflict {
					t.Fatalf("/verify conflict body: %s", hr.Body)
				}
			}

			if n := r.nonces(t); n != before {
				t.Fatalf("signer nonces %v -> %v: the conflicting payment was sent", before, n)
			}
			if got := env.Balance(t, second.PayTo); got != payeeBefore {
				t.Fatalf("the second payee went from %d to %d", payeeBefore, got)
			}
			if got := env.Balance(t, second.From()); got != payerBefore {
				t.Fatalf("the second payer went from %d to %d", payerBefore, got)
			}
			if _, err := r.db.SettlementByKey(ctx, second.Key()); !errors.Is(err, facilitator.ErrNotFound) {
				t.Fatalf("the conflicting authorization has a ledger row: %v", err)
			}
			if conflicts, _ := r.svc.Counts(); conflicts != int64(4*(i+1)) {
				t.Fatalf("conflict count %d after %d conflicts", conflicts, 4*(i+1))
			}

			// The id is still bound to the first payment, whose retry replays...
			if again, err := r.settle(t, first.Body(t)); err != nil || !again.Response.Success ||
				again.Response.Transaction != out.Response.Transaction || !facilitator.IsReplay(again.Response.Extensions) {
				t.Fatalf("the first payment's retry after the conflict: %+v %v", again.Response, err)
			}
			// ... and the second authorization is untouched: under an id of its own it settles.
			second.ID = stacktest.RandomID(t)
			if o, err := r.settle(t, second.Body(t)); err != nil || !o.Response.Success {
				t.Fatalf("the second payment under its own id: %+v %v", o.Response, err)
			}
		})
	}
}

func checkConflict(t *testing.T, what string, err error, differs []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error for a reused id", what)
	}
	if facilitator.ErrorCode(err) != facilitator.EConflict || facilitator.ErrorReason(err, "") != facilitator.ReasonPaymentIdentifierConflict {
		t.Fatalf("%s: code %s reason %s (%v), want %s %s", what, facilitator.ErrorCode(err), facilitator.ErrorReason(err, ""), err,
			facilitator.EConflict, facilitator.ReasonPaymentIdentifierConflict)
	}
	msg := facilitator.ErrorMessage(err)
	_, list, ok := strings.Cut(msg, "differs in: ")
	if !ok {
		t.Fatalf("%s: message %q does not say what differs", what, msg)
	}
	named := map[string]bool{}
	for _, k := range strings.Split(strings.TrimSuffix(list, ")"), ", ") {
		named[k] = true
	}
	for _, k := range differs {
		if !named[k] {
			t.Fatalf("%s: message %q does not name %q", what, msg, k)
		}
	}
	// What is the same is not named (the nonce and signature always differ between two authorizations).
	for _, k := range []string{"scheme", "network", "asset", "validAfter", "x402Version"} {
		if named[k] {
			t.Fatalf("%s: message %q names %q, which is the same", what, msg, k)
		}
	}
}

// TestConcurrentConflict: two different payments racing under one new id: exactly one settles,
// the other is the conflict, and there is one transfer only. Rounds where both requests passed
// the lookup are decided by the ledger's key on (scope, id) in the settlement's own statement.
func TestConcurrentConflict(t *testing.T) {
	r := newRig(t, rigOptions{})
	ctx := context.Background()
	const rounds = 8
	raced := 0
	for round := range rounds {
		id := stacktest.RandomID(t)
		a := newPay(t, env.FundedPayer(t, 1_000_000), 100_000)
		b := newPay(t, env.FundedPayer(t, 1_000_000), 200_000)
		a.ID, b.ID = id, id
		pays := []stacktest.Pay{a, b}
		bodies := [][]byte{a.Body(t), b.Body(t)}
		before := r.nonces(t)
		calls := r.engine.calls.Load()

		outs := make([]facilitator.SettleOutcome, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := stacktest.Decode(t, bodies[i])
				<-start
				outs[i], errs[i] = r.settlePayment(ctx, p)
			}()
		}
		close(start)
		wg.Wait()
		if r.engine.calls.Load()-calls == 2 {
			raced++
		}

		var won, lost = -1, -1
		for i := range 2 {
			switch {
			case errs[i] == nil && outs[i].Response.Success:
				won = i
			case errs[i] != nil:
				checkConflict(t, "racing settle", errs[i], []string{"from", "amount", "payTo"})
				lost = i
			default:
				t.Fatalf("round %d, request %d: %+v", round, i, outs[i].Response)
			}
		}
		if won < 0 || lost < 0 {
			t.Fatalf("round %d: want one success and one conflict, got %+v %v / %+v %v", round, outs[0].Response, errs[0], outs[1].Response, errs[1])
		}
		if n := r.nonces(t); n[1] != before[1]+1 {
			t.Fatalf("round %d: signer nonces %v -> %v, want exactly one transaction", round, before, n)
		}
		if got := env.Balance(t, pays[won].PayTo); got != pays[won].Value {
			t.Fatalf("round %d: the winner's payee holds %d", round, got)
		}
		if got := env.Balance(t, pays[lost].PayTo); got != 0 {
			t.Fatalf("round %d: the conflicting payee holds %d", round, got)
		}
		if _, err := r.db.SettlementByKey(ctx, pays[lost].Key()); !errors.Is(err, facilitator.ErrNotFound) {
			t.Fatalf("round %d: the conflicting authorization has a ledger row: %v", round, err)
		}
		if rec := r.record(t, id); rec.Settlement.ID != outs[won].SettlementID || rec.Fingerprint != stacktest.Decode(t, bodies[won]).IDFingerprint() {
			t.Fatalf("round %d: the id is bound to settlement %d, the winner's is %d", round, rec.Settlement.ID, outs[won].SettlementID)
		}
	}
	t.Logf("%d of %d rounds had both requests past the lookup (decided by the ledger insert)", raced, rounds)
}

// TestConcurrentSameID: the same request under the same new id, sent by several callers at once
// (a resource server retrying while its first call still runs): one transfer, and every caller
// gets that transaction as a success, at least all but one marked as a replay (invariant 5: same
// id and same fingerprint get the first request's answer, never already_settled).
func TestConcurrentSameID(t *testing.T) {
	r := newRig(t, rigOptions{})
	ctx := context.Background()
	p := newPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	body := p.Body(t)
	const n = 8
	outs := make([]facilitator.SettleOutcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := stacktest.Decode(t, body)
			<-start
			outs[i], errs[i] = r.settlePayment(ctx, q)
		}()
	}
	close(start)
	wg.Wait()

	tx := ""
	plain, replays := 0, 0
	var bad []string
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		res := outs[i].Response
		if tx == "" {
			tx = res.Transaction
		}
		if res.Transaction != tx || tx == "" {
			t.Fatalf("caller %d saw transaction %q, another %q", i, res.Transaction, tx)
		}
		switch {
		case !res.Success:
			bad = append(bad, res.ErrorReason)
		case facilitator.IsReplay(res.Extensions):
			replays++
		default:
			plain++
		}
	}
	if got := env.Balance(t, p.PayTo); got != 300_000 {
		t.Fatalf("payee holds %d, want 300000 once", got)
	}
	if nonces := r.nonces(t); nonces != [2]uint64{1, 1} {
		t.Fatalf("signer nonces %v, want exactly one transaction", nonces)
	}
	if len(bad) > 0 || plain > 1 || replays < n-1 {
		t.Fatalf("%d concurrent callers with the same id and request: %d plain successes, %d replayed successes, %d failures %v; "+
			"want every caller told success, at least %d of them as replays", n, plain, replays, len(bad), bad, n-1)
	}
}

// TestInFlight: while the first request's transaction waits for a block, a retry with the same id
// waits out the deadline and answers payment_in_flight with the same hash (Retry-After over
// HTTP), marked as a replay, and nothing is sent twice; once mined, the retry gets the success.
func TestInFlight(t *testing.T) {
	p := newPay(t, env.FundedPayer(t, 1_000_000), 400_000) // minted while anvil still mines
	body := p.Body(t)
	const deadline = time.Second
	stacktest.ManualMining(t, env.Chain)
	r := newRig(t, rigOptions{deadline: deadline})
	url := r.url

	start := time.Now()
	first, err := r.settle(t, body)
	if err != nil {
		t.Fatal(err)
	}
	if res := first.Response; res.Success || res.ErrorReason != facilitator.ReasonSettlementPending || res.Transaction == "" || facilitator.IsReplay(res.Extensions) {
		t.Fatalf("first request on a slow chain: %+v, want settlement_pending with a hash", res)
	}
	if took := time.Since(start); took < deadline-100*time.Millisecond || took > deadline+2*time.Second {
		t.Fatalf("first answer after %v, want about the %v deadline", took, deadline)
	}
	hash := first.Response.Transaction
	rec := r.record(t, p.ID)
	if !rec.Settlement.State.Open() || rec.Settlement.ID != first.SettlementID || rec.Response != nil {
		t.Fatalf("id record while pending: state %s settlement %d response %q; want open, %d, none stored",
			rec.Settlement.State, rec.Settlement.ID, rec.Response, first.SettlementID)
	}

	start = time.Now()
	second, err := r.settle(t, body)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	res := second.Response
	if res.Success || res.ErrorReason != facilitator.ReasonPaymentInFlight || res.Transaction != hash || replayID(res.Extensions) != p.ID || second.Claimed {
		t.Fatalf("retry while in flight: %+v; want payment_in_flight with %s, a replay", res, hash)
	}
	if took < deadline-100*time.Millisecond || took > deadline+2*time.Second {
		t.Fatalf("in-flight retry answered after %v, want it to wait about the %v deadline", took, deadline)
	}
	if n := r.nonces(t); n != [2]uint64{0, 1} {
		t.Fatalf("signer nonces %v while pending, want [0 1]: one transaction, sent once", n)
	}

	hr := post(t, url+"/settle", body)
	if hr.Status != http.StatusOK || hr.Header.Get("Retry-After") == "" || hr.Header.Get(facilitator.ReplayHeader) != "true" {
		t.Fatalf("in flight over HTTP: %d %v %s; want 200 with Retry-After and the replay header", hr.Status, hr.Header, hr.Body)
	}
	if sr := hr.settle(t); sr.ErrorReason != facilitator.ReasonPaymentInFlight || sr.Transaction != hash || sr.Success {
		t.Fatalf("in flight over HTTP: %s", hr.Body)
	}
	if v, err := r.verify(t, body); err != nil || !v.IsValid || !facilitator.IsReplay(v.Extensions) {
		t.Fatalf("verify while in flight: %+v %v", v, err)
	}
	if rec := r.record(t, p.ID); rec.Response != nil {
		t.Fatalf("an in-flight answer was stored: %s", rec.Response)
	}
	if n := r.nonces(t); n != [2]uint64{0, 1} {
		t.Fatalf("signer nonces %v while pending, want [0 1]", n)
	}

	env.Mine(t)

	third, err := r.settle(t, body)
	if err != nil {
		t.Fatal(err)
	}
	if !third.Response.Success || third.Response.Transaction != hash || replayID(third.Response.Extensions) != p.ID || !third.Claimed {
		t.Fatalf("retry after the block: %+v (claimed %v); want the success with %s, replayed", third.Response, third.Claimed, hash)
	}
	if rec := r.record(t, p.ID); rec.Response == nil || !rec.Settlement.State.Succeeded() {
		t.Fatalf("after the success: stored %q, state %s", rec.Response, rec.Settlement.State)
	}
	hr = post(t, url+"/settle", body)
	if sr := hr.settle(t); hr.Status != http.StatusOK || !sr.Success || sr.Transaction != hash || hr.Header.Get("Retry-After") != "" ||
		hr.Header.Get(facilitator.ReplayHeader) != "true" {
		t.Fatalf("a later replay over HTTP: %d %v %s", hr.Status, hr.Header, hr.Body)
	}
	if n := r.nonces(t); n != [2]uint64{1, 1} {
		t.Fatalf("signer nonces %v, want exactly one transaction", n)
	}
	if got := env.Balance(t, p.PayTo); got != 400_000 {
		t.Fatalf("payee holds %d, want 400000 once", got)
	}
}

// TestInFlightWaits: a retry that arrives while the first request still waits, and whose block
// comes within the deadline, waits and gets the success too (a replay); the first request, whose
// id it is, gets the success as well, whichever of the two claimed it; one transaction.
func TestInFlightWaits(t *testing.T) {
	p := newPay(t, env.FundedPayer(t, 1_000_000), 500_000)
	body := p.Body(t)
	const deadline = 10 * time.Second
	stacktest.ManualMining(t, env.Chain)
	r := newRig(t, rigOptions{deadline: deadline})

	type answer struct {
		out  facilitator.SettleOutcome
		err  error
		took time.Duration
	}
	call := func() <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			start := time.Now()
			out, err := r.settlePayment(context.Background(), stacktest.Decode(t, body))
			ch <- answer{out, err, time.Since(start)}
		}()
		return ch
	}
	firstCh := call()
	// The id is bound once the settlement is written, before the broadcast.
	for range 200 {
		if _, err := r.db.PaymentID(context.Background(), "", p.ID); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.record(t, p.ID)
	secondCh := call()
	time.Sleep(300 * time.Millisecond)
	if n := r.nonces(t); n != [2]uint64{0, 1} {
		t.Fatalf("signer nonces %v with two requests waiting, want [0 1]", n)
	}
	env.Mine(t)
	first, second := <-firstCh, <-secondCh
	if first.err != nil || second.err != nil {
		t.Fatalf("errors: %v / %v", first.err, second.err)
	}
	hash := first.out.Response.Transaction
	if !first.out.Response.Success || hash == "" {
		t.Fatalf("first request (waited %v): %+v; want the success", first.took, first.out.Response)
	}
	if !second.out.Response.Success || second.out.Response.Transaction != hash || replayID(second.out.Response.Extensions) != p.ID {
		t.Fatalf("second (waited %v): %+v; want the success with %s as a replay", second.took, second.out.Response, hash)
	}
	if first.took > deadline/2 || second.took > deadline/2 {
		t.Fatalf("answers took %v and %v: they did not wake on the block", first.took, second.took)
	}
	if n := r.nonces(t); n != [2]uint64{1, 1} {
		t.Fatalf("signer nonces %v, want exactly one transaction", n)
	}
	if got := env.Balance(t, p.PayTo); got != 500_000 {
		t.Fatalf("payee holds %d, want 500000 once", got)
	}
}

// TestRetention: the stored answer is kept for the window (but never less than validBefore plus
// the finality margin); past it a retry ignores the stale answer and rebuilds it from the ledger;
// the retention job then drops the answer and keeps the id's link, and a retry still gets the
// settlement's outcome from the ledger.
func TestRetention(t *testing.T) {
	const window, margin = time.Minute, 2 * time.Minute
	r := newRig(t, rigOptions{window: window, margin: margin})
	ctx := context.Background()
	p := newPay(t, env.FundedPayer(t, 1_000_000), 600_000)
	p.ValidBefore = big.NewInt(time.Now().Unix() + 120) // the stored answer's floor: validBefore + margin, past the window
	body := p.Body(t)

	t0 := r.clock.Now()
	out, err := r.settle(t, body)
	if err != nil || !out.Response.Success {
		t.Fatalf("settle: %+v %v", out.Response, err)
	}
	tx := out.Response.Transaction
	rec := r.record(t, p.ID)
	floor := time.Unix(p.ValidBefore.Int64(), 0).Add(margin)
	if rec.Response == nil || rec.ResponseExpires.Sub(floor).Abs() > time.Second {
		t.Fatalf("stored answer %q until %s; want one kept until validBefore+margin %s (past T0+window %s)",
			rec.Response, rec.ResponseExpires, floor, t0.Add(window))
	}

	replay := func(what string, fromStore bool) facilitator.SettleOutcome {
		t.Helper()
		calls := r.engine.calls.Load()
		out, err := r.settle(t, body)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		res := out.Response
		if !res.Success || res.Transaction != tx || res.ErrorReason != "" || replayID(res.Extensions) != p.ID {
			t.Fatalf("%s: %+v; want the success with %s, replayed", what, res, tx)
		}
		if called := r.engine.calls.Load() != calls; called == fromStore {
			t.Fatalf("%s: engine called %v, want the answer from the store %v", what, called, fromStore)
		}
		return out
	}

	// Past the window, within validBefore + margin: still the stored answer.
	r.clock.Advance(window + 10*time.Second)
	replay("past the window, before the validBefore floor", true)

	// Past the floor, before compaction: the stale stored answer is ignored (the lookup checks
	// the expiry) and the outcome is rebuilt from the ledger.
	r.clock.Advance(10 * time.Minute)
	if n := r.clock.Now(); !n.After(rec.ResponseExpires) {
		t.Fatalf("clock %s is not past the expiry %s", n, rec.ResponseExpires)
	}
	replay("past the expiry, before compaction", false)
	// The rebuilt answer is stored again, for a new window from now.
	rec = r.record(t, p.ID)
	if rec.Response == nil || rec.ResponseExpires.Sub(r.clock.Now().Add(window)).Abs() > 5*time.Second {
		t.Fatalf("after the rebuilt answer: stored %q until %s, want until now+window %s", rec.Response, rec.ResponseExpires, r.clock.Now().Add(window))
	}

	// The retention job, run past that window: the answer goes, the link stays.
	r.clock.Advance(time.Hour)
	n, err := r.svc.Compact(ctx)
	if err != nil || n < 1 {
		t.Fatalf("Compact: %d %v, want at least 1", n, err)
	}
	rec = r.record(t, p.ID)
	if rec.Response != nil {
		t.Fatalf("stored answer %q survived compaction", rec.Response)
	}
	if rec.Settlement == nil || rec.Settlement.ID != out.SettlementID || !rec.Settlement.State.Succeeded() || rec.Settlement.TxHash.Hex() != tx ||
		rec.Fingerprint != stacktest.Decode(t, body).IDFingerprint() {
		t.Fatalf("link after compaction: %+v; want settlement %d mined with %s", rec.Settlement, out.SettlementID, tx)
	}
	if n, err := r.svc.Compact(ctx); err != nil || n != 0 {
		t.Fatalf("second Compact: %d %v, want 0", n, err)
	}

	// A retry now: the outcome from the compact link, rebuilt from the ledger.
	replay("after compaction", false)
	if v, err := r.verify(t, body); err != nil || !v.IsValid || replayID(v.Extensions) != p.ID {
		t.Fatalf("verify after compaction: %+v %v", v, err)
	}
	// A different payment under the compacted id is still a conflict.
	other := newPay(t, env.FundedPayer(t, 1_000_000), 1)
	other.ID = p.ID
	_, err = r.settle(t, other.Body(t))
	checkConflict(t, "after compaction", err, []string{"amount", "from"})

	if n := r.nonces(t); n != [2]uint64{1, 1} {
		t.Fatalf("signer nonces %v, want exactly one transaction", n)
	}
	if got := env.Balance(t, p.PayTo); got != 600_000 {
		t.Fatalf("payee holds %d, want 600000 once", got)
	}
}

// TestInvalidLeavesIDFree: a payment that fails verification writes no settlement and so binds no
// id; the same request under the same id settles once it is valid.
func TestInvalidLeavesIDFree(t *testing.T) {
	r := newRig(t, rigOptions{})
	ctx := context.Background()
	payer, err := crypto.GenerateKey() // no USDC yet
	if err != nil {
		t.Fatal(err)
	}
	p := newPay(t, payer, 70_000)
	body := p.Body(t)
	out, err := r.settle(t, body)
	if err != nil || out.Response.Success || out.Response.ErrorReason != facilitator.ReasonInsufficientBalance {
		t.Fatalf("unfunded: %+v %v", out.Response, err)
	}
	if _, err := r.db.PaymentID(ctx, "", p.ID); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("a rejected payment bound its id: %v", err)
	}
	if v, err := r.verify(t, body); err != nil || v.IsValid || v.InvalidReason != facilitator.ReasonInsufficientBalance || v.Extensions != nil {
		t.Fatalf("verify unfunded: %+v %v", v, err)
	}
	if err := env.Chain.USDC.Mint(ctx, p.From(), big.NewInt(p.Value)); err != nil {
		t.Fatal(err)
	}
	out, err = r.settle(t, body)
	if err != nil || !out.Response.Success || facilitator.IsReplay(out.Response.Extensions) {
		t.Fatalf("after funding: %+v %v", out.Response, err)
	}
	if rec := r.record(t, p.ID); rec.Settlement.ID != out.SettlementID {
		t.Fatalf("id bound to %d, want %d", rec.Settlement.ID, out.SettlementID)
	}
}

// TestStoredSuccessCounts: a success claimed under a payment identifier counts once its answer is
// stored under the id, before the API writes it: the id's retries are answered from it, so a copy
// of the payload sent without the id to another process is told already_settled at once, not
// settlement_pending (and never, once a dead process's claim lapsed, the success a second time).
func TestStoredSuccessCounts(t *testing.T) {
	r := newRig(t, rigOptions{})
	ctx := context.Background()
	p := newPay(t, env.FundedPayer(t, 1_000_000), 250_000)
	out, err := r.svc.Settle(ctx, stacktest.Decode(t, p.Body(t))) // its answer is never written
	if err != nil || !out.Claimed || !out.Response.Success {
		t.Fatalf("first settle: %+v %v; want the claimed success", out, err)
	}
	other := env.NewEngine(t, stacktest.EngineOptions{}) // another process on the same ledger
	p.ID = ""
	got, err := other.Engine.Settle(ctx, stacktest.Decode(t, p.Body(t)))
	if err != nil || got.Claimed || got.Response.ErrorReason != facilitator.ReasonAlreadySettled || got.Response.Transaction != out.Response.Transaction {
		t.Fatalf("the payload without the id, elsewhere: %+v %v; want already_settled with %s", got.Response, err, out.Response.Transaction)
	}
}
