package loadgen

import (
	"math"
	"slices"
	"time"
)

// Latencies are the durations of the requests of one load phase.
type Latencies []time.Duration

// Percentile is the nearest-rank q-quantile (0 < q <= 1): the smallest sample at or below which
// a fraction q of the samples lie. Nearest rank never interpolates, so a p99 is a latency some
// request really had. It returns 0 for no samples.
func (l Latencies) Percentile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// rate is events per second over d; 0 when nothing was timed.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
