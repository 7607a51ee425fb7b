package facilitator

import (
	"testing"
	"time"
)

// TestCloseBatch: a batch closes full, or once its first settlement has waited; otherwise it says
// how long is left. The clock is the caller's.
func TestCloseBatch(t *testing.T) {
	p := BatchPolicy{Max: 3, Wait: 150 * time.Millisecond}
	t0 := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name  string
		n     int
		now   time.Time
		close bool
		wait  time.Duration
	}{
		{"empty never closes", 0, t0.Add(time.Hour), false, 150 * time.Millisecond},
		{"one, just arrived", 1, t0, false, 150 * time.Millisecond},
		{"two, part waited", 2, t0.Add(100 * time.Millisecond), false, 50 * time.Millisecond},
		{"full closes at once", 3, t0, true, 0},
		{"over full closes", 5, t0, true, 0},
		{"waited exactly", 1, t0.Add(150 * time.Millisecond), true, 0},
		{"waited past", 2, t0.Add(time.Second), true, 0},
	} {
		close, wait := p.CloseBatch(c.n, t0, c.now)
		if close != c.close || wait != c.wait {
			t.Errorf("%s: close %v wait %s, want %v %s", c.name, close, wait, c.close, c.wait)
		}
	}
}

func TestBatchPolicyCheck(t *testing.T) {
	for _, p := range []BatchPolicy{{Max: 101}, {Max: -1}, {Max: 10, Wait: 3 * time.Second}, {Max: 10, Wait: -1}} {
		if p.Check() == nil {
			t.Errorf("%+v passed", p)
		}
	}
	for _, p := range []BatchPolicy{{}, {Max: 100, Wait: 2 * time.Second}, {Max: 20, Wait: 150 * time.Millisecond}} {
		if err := p.Check(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if (BatchPolicy{Max: 1}).On() || (BatchPolicy{}).On() || !(BatchPolicy{Max: 2}).On() {
		t.Error("On")
	}
}
