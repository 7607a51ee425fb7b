package paymentid_test

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// BenchmarkReplay measures a /settle replay over HTTP with the full stack (API, payment-identifier
// service, real ledger, engine): one payment is settled under an id before the timer, then b.N
// requests resend the same body and get the stored answer. It reports the per-request latency's
// p50 and p99 in microseconds.
//
//	go test ./paymentid/ -run '^$' -bench BenchmarkReplay -benchtime 2000x
func BenchmarkReplay(b *testing.B) {
	r := newRig(b, rigOptions{quiet: true})
	url := r.url + "/settle"
	p := newPay(b, env.FundedPayer(b, 1_000_000), 10_000)
	body := p.Body(b)
	first := post(b, url, body)
	if res := first.settle(b); first.Status != http.StatusOK || !res.Success {
		b.Fatalf("first settle: %d %s", first.Status, first.Body)
	}
	tx := first.settle(b).Transaction
	client := &http.Client{Timeout: 10 * time.Second}
	calls := r.engine.calls.Load()

	durations := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		res, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		raw, err := io.ReadAll(res.Body)
		res.Body.Close()
		took := time.Since(start)
		if err != nil || res.StatusCode != http.StatusOK || res.Header.Get(facilitator.ReplayHeader) != "true" || !bytes.Contains(raw, []byte(tx)) {
			b.Fatalf("replay: %d %v %s", res.StatusCode, err, raw)
		}
		durations = append(durations, took)
	}
	b.StopTimer()

	if got := r.engine.calls.Load() - calls; got != 0 {
		b.Fatalf("%d replays reached the engine; want every one answered from the stored answer", got)
	}
	if n := r.nonces(b); n != [2]uint64{1, 1} {
		b.Fatalf("signer nonces %v after the replays, want exactly one transaction", n)
	}
	slices.Sort(durations)
	pct := func(q float64) float64 {
		i := int(q * float64(len(durations)-1))
		return float64(durations[i].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
