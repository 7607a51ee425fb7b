package ops

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clock is a settable test clock, safe to read from many goroutines.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock    { c := &clock{}; c.ns.Store(t.UnixNano()); return c }
func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// Every bin's upper bound falls in that bin, and each percentile is its sample's bin bound: at
// or above the true value, and at most one growth step above it.
func TestHistogramQuantiles(t *testing.T) {
	for i := range bins - 1 {
		if got := binOf(upper(i)); got != i {
			t.Fatalf("binOf(upper(%d) = %s) = %d", i, upper(i), got)
		}
		if got := binOf(upper(i) + time.Nanosecond); got != i+1 {
			t.Fatalf("binOf(just above upper(%d)) = %d", i, got)
		}
	}
	var h histogram
	if _, ok := h.quantile(.5); ok {
		t.Fatal("an empty histogram has a median")
	}
	for ms := 1; ms <= 100; ms++ {
		h.add(time.Duration(ms) * time.Millisecond)
	}
	for q, exact := range map[float64]time.Duration{.5: 50 * time.Millisecond, .9: 90 * time.Millisecond, .99: 99 * time.Millisecond} {
		got, ok := h.quantile(q)
		if !ok || got < exact || float64(got) > float64(exact)*binGrowth {
			t.Errorf("p%v = %s, want within [%s, %s·%v]", q*100, got, exact, exact, binGrowth)
		}
	}
	h.add(time.Hour) // beyond the last bound: counted in the last bin, not lost
	if h.count() != 101 {
		t.Fatalf("count %d, want 101", h.count())
	}
	if got, _ := h.quantile(1); got != upper(bins-1) {
		t.Fatalf("max %s, want the last bin's %s", got, upper(bins-1))
	}
}

// The ring keeps one bucket per minute for the last hour: a minute's answers are in the window
// until it is an hour old, then gone, and a bucket reused for a new minute starts empty.
func TestAnswersRing(t *testing.T) {
	c := newClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	a := NewAnswers(c.now)
	a.Verified("eip155:1", "valid", 3*time.Millisecond)
	a.Verified("eip155:1", "invalid_exact_evm_payload_signature", time.Millisecond)
	a.Settled("eip155:1", "ok", 80*time.Millisecond)
	w := a.Window()
	if len(w) != Minutes || !w[Minutes-1].Start.Equal(c.now().Truncate(time.Minute)) {
		t.Fatalf("window of %d ending %s", len(w), w[len(w)-1].Start)
	}
	last := w[Minutes-1]
	if last.Reasons[Verify]["valid"] != 1 || last.Reasons[Verify]["invalid_exact_evm_payload_signature"] != 1 || last.Reasons[Settle]["ok"] != 1 {
		t.Fatalf("last minute %+v", last.Reasons)
	}
	c.add(30 * time.Minute)
	a.Settled("eip155:1", "ok", time.Second)
	w = a.Window()
	if w[Minutes-31].Reasons[Settle]["ok"] != 1 || w[Minutes-1].Reasons[Settle]["ok"] != 1 {
		t.Fatalf("after 30 minutes: %v then %v", w[Minutes-31].Reasons, w[Minutes-1].Reasons)
	}
	c.add(30 * time.Minute) // the first minute is an hour old now: out of the window
	w = a.Window()
	total := 0
	for _, m := range w {
		total += m.Reasons[Settle]["ok"] + m.Reasons[Verify]["valid"]
	}
	if total != 1 {
		t.Fatalf("an hour on, %d answers in the window, want only the one of 30 minutes ago", total)
	}
	// The bucket of the hour-old minute is reused for this one and starts empty.
	a.Verified("eip155:1", "valid", time.Millisecond)
	if got := a.Window()[Minutes-1].Reasons; got[Verify]["valid"] != 1 || got[Settle]["ok"] != 0 {
		t.Fatalf("reused bucket %v", got)
	}
	if n := a.Window()[Minutes-1].Latency[Verify].count(); n != 1 {
		t.Fatalf("reused bucket holds %d latencies", n)
	}
}

// A minute keeps at most maxReasons reasons per endpoint: more count as "other".
func TestAnswersBoundedReasons(t *testing.T) {
	c := newClock(time.Unix(1e9, 0))
	a := NewAnswers(c.now)
	for i := range maxReasons + 10 {
		a.Settled("", fmt.Sprintf("reason_%d", i), time.Millisecond)
	}
	got := a.Window()[Minutes-1].Reasons[Settle]
	if len(got) != maxReasons+1 || got["other"] != 10 {
		t.Fatalf("%d reasons, other %d", len(got), got["other"])
	}
}

// The overview's per-minute series and hour totals come out of the ring aligned with its minutes.
func TestAnswersOf(t *testing.T) {
	c := newClock(time.Unix(1e9, 0))
	a := NewAnswers(c.now)
	a.Settled("", "ok", 10*time.Millisecond)
	c.add(2 * time.Minute)
	a.Settled("", "ok", 10*time.Millisecond)
	a.Settled("", "settlement_pending", 2*time.Second)
	counts, lat := answersOf(a.Window())
	if s := counts.Settle["ok"]; s[Minutes-3] != 1 || s[Minutes-1] != 1 || counts.SettleTotal["ok"] != 2 || counts.SettleTotal["settlement_pending"] != 1 {
		t.Fatalf("counts %+v", counts)
	}
	if lat.Settle.P50[Minutes-2] != nil || lat.Settle.P50[Minutes-1] == nil || lat.Settle.Hour.Count != 3 {
		t.Fatalf("latency %+v", lat.Settle)
	}
	if p99 := lat.Settle.Hour.P99; p99 < 2000 || p99 > 2500 {
		t.Fatalf("hour p99 %v ms, want the 2 s answer's bin", p99)
	}
	if counts.Scope != "this replica" {
		t.Fatalf("scope %q", counts.Scope)
	}
}

// The cache reads once per period however many ask at once, and again once the period is over.
func TestCacheSingleFlight(t *testing.T) {
	c := newClock(time.Unix(1e9, 0))
	var reads atomic.Int32
	release := make(chan struct{})
	ch := newCache(3*time.Second, c.now, func(context.Context) int {
		<-release
		return int(reads.Add(1))
	})
	var wg sync.WaitGroup
	got := make([]int, 8)
	for i := range got {
		wg.Go(func() { got[i] = ch.get(context.Background()) })
	}
	time.Sleep(10 * time.Millisecond) // let them pile up behind the first read (not a timing assertion)
	close(release)
	wg.Wait()
	for _, v := range got {
		if v != 1 {
			t.Fatalf("answers %v: want every caller to share the one read", got)
		}
	}
	c.add(3 * time.Second)
	if v := ch.get(context.Background()); v != 2 || reads.Load() != 2 {
		t.Fatalf("after the period: %d (%d reads)", v, reads.Load())
	}
	// A caller whose context ends while another reads does not wait for it.
	block := make(chan struct{})
	slow := newCache(time.Second, c.now, func(context.Context) int { <-block; return 1 })
	go slow.get(context.Background())
	time.Sleep(10 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if v := slow.get(ctx); v != 0 {
		t.Fatalf("a canceled caller got %d", v)
	}
	close(block)
}
