package settle

import (
	"context"
	"testing"
)

// announced is a Heads that announces its heads in order, then returns.
type announced []uint64

func (a announced) Subscribed() bool { return true }

func (a announced) Follow(_ context.Context, fn func(head uint64)) {
	for _, h := range a {
		fn(h)
	}
}

// TestFollowHeads: each announcement wakes the watcher and raises the head hint to the highest
// head announced; a restart (0) only wakes it; without Heads nothing happens.
func TestFollowHeads(t *testing.T) {
	woken := func(n *chainEngine) bool {
		select {
		case <-n.kick:
			return true
		default:
			return false
		}
	}
	n := &chainEngine{kick: make(chan struct{}, 1)}
	n.followHeads(t.Context())
	if woken(n) || n.headHint.Load() != 0 {
		t.Fatalf("without Heads: woken or hint %d", n.headHint.Load())
	}
	n.heads = announced{0}
	n.followHeads(t.Context())
	if !woken(n) || n.headHint.Load() != 0 {
		t.Fatalf("a restart: not woken, or hint %d", n.headHint.Load())
	}
	n.heads = announced{7, 5, 0}
	n.followHeads(t.Context())
	if !woken(n) || n.headHint.Load() != 7 {
		t.Fatalf("heads 7, 5, 0: hint %d, want 7", n.headHint.Load())
	}
}
