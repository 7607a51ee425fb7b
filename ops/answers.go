package ops

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Answers records this replica's /verify and /settle answers, by reason, and their latencies, in
// a ring of one bucket per minute over the last hour: fixed memory whatever the traffic. The
// answers are not persisted (the ledger has settlements, not refusals), so each replica knows
// only its own. It is the api's Observer (cmd hands it every answer).
type Answers struct {
	now func() time.Time

	mu      sync.Mutex
	buckets [Minutes]minuteBucket
}

// Minutes is the overview's window, in one-minute buckets.
const Minutes = 60

// maxReasons bounds the reason codes one minute keeps per endpoint; any more count as "other"
// (the codes are a closed set, but a bug must not grow memory).
const maxReasons = 32

// Endpoints, as Answers counts them.
const (
	Verify = 0
	Settle = 1
)

type minuteBucket struct {
	minute  int64 // Unix minute the bucket holds; a stale one is reset on first use
	reasons [2]map[string]int
	latency [2]histogram
}

// NewAnswers builds an empty ring; now is the clock (time.Now when nil).
func NewAnswers(now func() time.Time) *Answers {
	if now == nil {
		now = time.Now
	}
	return &Answers{now: now}
}

// Verified records a /verify answer (api.Observer).
func (a *Answers) Verified(_, reason string, took time.Duration) { a.record(Verify, reason, took) }

// Settled records a /settle answer (api.Observer).
func (a *Answers) Settled(_, reason string, took time.Duration) { a.record(Settle, reason, took) }

func (a *Answers) record(endpoint int, reason string, took time.Duration) {
	m := a.now().Unix() / 60
	a.mu.Lock()
	defer a.mu.Unlock()
	b := &a.buckets[m%Minutes]
	if b.minute != m {
		*b = minuteBucket{minute: m}
	}
	r := b.reasons[endpoint]
	if r == nil {
		r = map[string]int{}
		b.reasons[endpoint] = r
	}
	if _, ok := r[reason]; !ok && len(r) >= maxReasons {
		reason = "other"
	}
	r[reason]++
	b.latency[endpoint].add(took)
}

// Minute is one minute of answers as Window reads it.
type Minute struct {
	Start   time.Time
	Reasons [2]map[string]int // by endpoint (Verify, Settle); nil when none
	Latency [2]histogram
}

// Window is the last Minutes minutes, oldest first, the current minute last; minutes without
// answers are there, empty.
func (a *Answers) Window() []Minute {
	now := a.now().Unix() / 60
	out := make([]Minute, Minutes)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range out {
		m := now - int64(Minutes-1-i)
		out[i].Start = time.Unix(m*60, 0).UTC()
		b := &a.buckets[((m%Minutes)+Minutes)%Minutes]
		if b.minute != m {
			continue
		}
		for e := range 2 {
			if len(b.reasons[e]) > 0 {
				out[i].Reasons[e] = make(map[string]int, len(b.reasons[e]))
				for k, v := range b.reasons[e] {
					out[i].Reasons[e][k] = v
				}
			}
			out[i].Latency[e] = b.latency[e]
		}
	}
	return out
}

// histogram counts latencies in fixed, exponentially widening bins: bin i holds durations up to
// binBase·binGrowth^i (100 µs to about two minutes; the last bin takes anything longer). A
// percentile is read as its bin's upper bound, so it is at most 25% high, never low.
type histogram [bins]uint32

const (
	bins      = 64
	binBase   = 100 * time.Microsecond
	binGrowth = 1.25
)

// binOf is the bin of d.
func binOf(d time.Duration) int {
	if d <= binBase {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(binBase)) / math.Log(binGrowth)))
	if i >= bins {
		return bins - 1
	}
	// Float rounding can put a bound's own value one bin up: correct it so bounds are inclusive.
	if i > 0 && d <= upper(i-1) {
		i--
	}
	return i
}

// upper is bin i's upper bound.
func upper(i int) time.Duration {
	return time.Duration(float64(binBase) * math.Pow(binGrowth, float64(i)))
}

func (h *histogram) add(d time.Duration) { h[binOf(d)]++ }

func (h *histogram) merge(o histogram) {
	for i := range h {
		h[i] += o[i]
	}
}

func (h *histogram) count() int {
	n := 0
	for _, c := range h {
		n += int(c)
	}
	return n
}

// quantile is the q-quantile (0 < q ≤ 1) as its bin's upper bound; ok is false without samples.
func (h *histogram) quantile(q float64) (time.Duration, bool) {
	n := h.count()
	if n == 0 {
		return 0, false
	}
	rank := int(math.Ceil(q * float64(n))) // the rank-th smallest sample, 1-based
	if rank < 1 {
		rank = 1
	}
	seen := 0
	for i, c := range h {
		seen += int(c)
		if seen >= rank {
			return upper(i), true
		}
	}
	return upper(bins - 1), true
}

// sortedKeys are a count map's keys in order, for stable output.
func sortedKeys(ms ...map[string]int) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}
