package loadgen_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/loadgen"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// BenchmarkBackfill measures backfill throughput, events per second from anvil into Postgres, with
// the default log ranges: 100,000 events (50,000 Transfer and 50,000 AuthorizationUsed, from
// devchain/testdata/Emitter.sol) in 50 transactions, indexed from the Emitter's deploy block to the
// head. The chain and the timed run are loadgen's, the same as 'facilitator-dev bench' measures; the
// chain and the database are the benchmark's own.
//
//	go test ./loadgen/ -run '^$' -bench BenchmarkBackfill -benchtime 1x
func BenchmarkBackfill(b *testing.B) {
	ctx := context.Background()
	chain := stacktest.NewChain(b, devchain.Options{})
	store, err := postgres.Open(ctx, stacktest.NewDB(b, "loadgen"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	key, err := devchain.BenchEmitter()
	if err != nil {
		b.Fatal(err)
	}
	begin := time.Now()
	e, err := loadgen.EmitEvents(ctx, chain.RPC, 10*time.Second, key.Key, 100_000)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("chain: %d events from %s in %d transactions, head %d; built in %s", e.Events, e.Contract, e.Calls, e.Head, time.Since(begin).Round(time.Millisecond))
	log, stopLog := stacktest.QuietableLoggerAt(b, slog.LevelInfo)
	defer stopLog()
	var took time.Duration
	b.ResetTimer()
	for i := range b.N {
		network := fmt.Sprintf("%s#%s-%d", facilitator.CAIP2(chain.ChainID), b.Name(), i)
		r, err := loadgen.TimeBackfill(ctx, chain.RPC, 10*time.Second, store, network, e, log)
		if err != nil {
			b.Fatal(err)
		}
		took += r.Elapsed
	}
	b.StopTimer()
	// For scale: the one eth_getLogs (decoded into go-ethereum logs, as the indexer does) alone.
	begin = time.Now()
	var logs []types.Log
	if err := chain.RPC.CallContext(ctx, &logs, "eth_getLogs", map[string]any{"fromBlock": hexutil.EncodeUint64(e.DeployBlock),
		"toBlock": hexutil.EncodeUint64(e.Head), "address": []common.Address{e.Contract}}); err != nil || len(logs) != e.Events {
		b.Fatalf("eth_getLogs: %d logs, %v", len(logs), err)
	}
	getLogs := time.Since(begin)
	// The figure is the indexer's time alone (TimeBackfill's), not the binding and counting around it.
	eps := float64(e.Events*b.N) / took.Seconds()
	b.ReportMetric(eps, "events/s")
	b.ReportMetric(float64(e.Events), "events")
	b.ReportMetric(float64(e.Head-e.DeployBlock+1), "blocks")
	b.Logf("backfill: %d events in blocks %d..%d indexed in %s per run: %.0f events/s (one eth_getLogs of them all alone: %s)",
		e.Events, e.DeployBlock, e.Head, (took / time.Duration(b.N)).Round(time.Millisecond), eps, getLogs.Round(time.Millisecond))
}
