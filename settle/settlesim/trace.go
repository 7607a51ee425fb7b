package settlesim

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"math/rand/v2"
	"sync"
)

// Trace is a running hash of everything the simulated components were asked and answered. Two
// runs from the same seed must end with the same Sum; when they do not, the kept lines (Keep)
// show where they parted.
type Trace struct {
	mu    sync.Mutex
	h     hash.Hash
	n     int
	keep  int
	lines []string
}

// NewTrace returns an empty trace that keeps the last keep lines (0: none) for diagnosis.
func NewTrace(keep int) *Trace { return &Trace{h: sha256.New(), keep: keep} }

// Record adds a line. A nil trace records nothing, so components can hold one unconditionally.
func (t *Trace) Record(format string, args ...any) {
	if t == nil {
		return
	}
	line := fmt.Sprintf(format, args...)
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.h, "%d %s\n", t.n, line)
	t.n++
	if t.keep > 0 {
		if len(t.lines) == t.keep {
			t.lines = append(t.lines[:0], t.lines[1:]...)
		}
		t.lines = append(t.lines, line)
	}
}

// Sum is the hash of every line recorded so far.
func (t *Trace) Sum() [32]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out [32]byte
	copy(out[:], t.h.Sum(nil))
	return out
}

// Len is the number of lines recorded.
func (t *Trace) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Lines are the last lines kept.
func (t *Trace) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines...)
}

// Fork derives an independent generator from r. Each component takes its own at construction, so
// that the draws of one never shift another's when a driver changes how often it calls them.
func Fork(r *rand.Rand) *rand.Rand { return rand.New(rand.NewPCG(r.Uint64(), r.Uint64())) }
