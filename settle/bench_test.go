package settle_test

import (
	"crypto/ecdsa"
	"flag"
	"log/slog"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

var (
	benchK       = flag.Int("settle.k", 1000, "BenchmarkSettle: distinct payments per run")
	benchC       = flag.Int("settle.c", 64, "BenchmarkSettle: concurrent /settle callers")
	benchSigners = flag.Int("settle.Signers", 4, "BenchmarkSettle: signer keys")
	benchPoll    = flag.Duration("settle.poll", 0, "BenchmarkSettle: receipt poll interval (0: the tests' 50ms)")
)

// BenchmarkSettle settles K distinct pre-signed payments at concurrency C against anvil
// (auto-mine) through the engine and the real ledger, and reports settlements per second from the
// first request to the last success. Signing is not timed. Every payment must be paid exactly once.
//
//	go test ./settle/ -run '^$' -bench BenchmarkSettle -benchtime 1x -settle.k 1000 -settle.c 64
func BenchmarkSettle(b *testing.B) {
	signers := make([]*ecdsa.PrivateKey, *benchSigners)
	for i := range signers {
		signers[i] = env.NewSigner(b)
	}
	r := env.NewEngine(b, stacktest.EngineOptions{Signers: signers, Deadline: time.Minute, Config: func(c *settle.Config) {
		c.Logger = slog.New(slog.DiscardHandler)
		if *benchPoll > 0 {
			c.PollInterval = *benchPoll
		}
	}})
	for range b.N {
		b.StopTimer()
		pays, bodies := payersOfTheirOwn(b, *benchK, 10_000)
		b.StartTimer()
		start := time.Now()
		failed := settleThrough(b, r, bodies, *benchC)
		elapsed := time.Since(start)
		b.StopTimer()
		if len(failed) > 0 {
			b.Fatalf("%d of %d settlements failed; first: %s", len(failed), *benchK, failed[0])
		}
		transfers := 0
		for _, p := range pays {
			if env.Balance(b, p.PayTo) == p.Value {
				transfers++
			}
		}
		if transfers != *benchK {
			b.Fatalf("%d payees paid for %d payments", transfers, *benchK)
		}
		b.ReportMetric(float64(*benchK)/elapsed.Seconds(), "settlements/s")
		b.ReportMetric(float64(transfers), "transfers")
		b.StartTimer()
	}
}
