package loadgen

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
)

// sign is a sender's X402-Signature, computed here from the documented rule (HMAC-SHA256 of
// "<timestamp>.<body>" keyed with the secret's text), not by the package under test.
func sign(secret string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(ts, 10) + "."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func event(t *testing.T, id, typ, nonce string, created time.Time) []byte {
	t.Helper()
	b, err := json.Marshal(notify.Message{ID: id, Type: typ, CreatedAt: created, Data: facilitator.AuthorizationStatus{Nonce: nonce}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHookReceiver: a signed delivery is kept once by event id (a retry is acknowledged and
// counted as a duplicate, keeping the first receipt), and an unsigned or wrongly signed one is
// refused and counted, never kept.
func TestHookReceiver(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	h := newHookReceiver(func() time.Time { return now })
	h.setSecret("s3cret")
	body := event(t, "7", "settlement.mined", "0xABCD", t0)
	ts := t0.Unix()

	now = t0.Add(300 * time.Millisecond)
	if code := h.receive(now, strconv.FormatInt(ts, 10), sign("s3cret", ts, body), body); code != http.StatusNoContent {
		t.Fatalf("signed delivery answered %d", code)
	}
	now = t0.Add(5 * time.Second)
	if code := h.receive(now, strconv.FormatInt(ts, 10), sign("s3cret", ts, body), body); code != http.StatusNoContent {
		t.Fatalf("retried delivery answered %d", code)
	}
	for name, c := range map[string]struct{ ts, sig string }{
		"wrong secret":    {strconv.FormatInt(ts, 10), sign("other", ts, body)},
		"wrong ts":        {strconv.FormatInt(ts+1, 10), sign("s3cret", ts, body)},
		"no signature":    {strconv.FormatInt(ts, 10), ""},
		"no timestamp":    {"", sign("s3cret", ts, body)},
		"body of another": {strconv.FormatInt(ts, 10), sign("s3cret", ts, event(t, "8", "settlement.final", "0xabcd", t0))},
	} {
		if code := h.receive(now, c.ts, c.sig, body); code != http.StatusUnauthorized {
			t.Errorf("%s: answered %d, want 401", name, code)
		}
	}
	if len(h.got) != 1 || h.dups != 1 || h.badSig != 5 {
		t.Fatalf("kept %d, duplicates %d, bad signatures %d; want 1, 1, 5", len(h.got), h.dups, h.badSig)
	}
	d := h.got["7"]
	if d.typ != "settlement.mined" || d.nonce != "0xabcd" || d.received.Sub(d.created) != 300*time.Millisecond {
		t.Fatalf("kept %+v: want the first receipt, nonce lowercased", d)
	}
}

// TestTallyHooks: each confirmed payment owes broadcast, mined and final; an event of another
// payment is counted apart; the latencies are created-to-received of the phase's events only.
func TestTallyHooks(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	got := map[string]hookDelivery{
		"1": {typ: "settlement.broadcast", nonce: "0xa", created: at(0), received: at(100)},
		"2": {typ: "settlement.mined", nonce: "0xa", created: at(10), received: at(210)},
		"3": {typ: "settlement.final", nonce: "0xa", created: at(20), received: at(1020)},
		"4": {typ: "settlement.broadcast", nonce: "0xb", created: at(0), received: at(400)},
		"5": {typ: "settlement.final", nonce: "0xold", created: at(0), received: at(5000)},
	}
	tl := tallyHooks(got, map[string]bool{"0xa": true, "0xb": true})
	// 0xb lacks mined and final.
	if tl.delivered != 4 || tl.missing != 2 || tl.others != 1 || !tl.last.Equal(at(1020)) {
		t.Fatalf("tally %+v: want 4 delivered, 2 missing, 1 other, last at +1020ms", tl)
	}
	if p := tl.lats.Percentile(1); p != time.Second {
		t.Fatalf("max latency %s, want 1s (0xa's final)", p)
	}
	got["6"] = hookDelivery{typ: "settlement.mined", nonce: "0xb", created: at(30), received: at(500)}
	got["7"] = hookDelivery{typ: "settlement.final", nonce: "0xb", created: at(40), received: at(600)}
	if tl := tallyHooks(got, map[string]bool{"0xa": true, "0xb": true}); tl.missing != 0 || tl.delivered != 6 {
		t.Fatalf("complete tally %+v: want 6 delivered, none missing", tl)
	}
}

// TestExtraMsPerOp: the phase's CPU less its settlements at the base phase's rate, per event;
// unmeasured roles give no figure.
func TestExtraMsPerOp(t *testing.T) {
	// 100 ticks/s: a tick is 10 ms.
	base := &CPUPhase{Ops: 100, ClkTck: 100, Roles: []RoleCPU{{Role: RoleFacilitator, Ticks: 50}, {Role: RolePostgres, Err: "skipped"}}}
	// 100 settlements at 5 ms each = 500 ms, plus 300 ms of dispatch, over 300 events.
	phase := &CPUPhase{Ops: 300, ClkTck: 100, Roles: []RoleCPU{{Role: RoleFacilitator, Ticks: 80}, {Role: RolePostgres, Ticks: 9}}}
	if ms, ok := extraMsPerOp(phase, base, 100, RoleFacilitator); !ok || ms < 0.999 || ms > 1.001 {
		t.Fatalf("extra = %v %v, want 1 ms per event", ms, ok)
	}
	if _, ok := extraMsPerOp(phase, base, 100, RolePostgres); ok {
		t.Fatal("a role the base did not measure gave a figure")
	}
	if _, ok := extraMsPerOp(phase, nil, 100, RoleFacilitator); ok {
		t.Fatal("no base phase gave a figure")
	}
}
