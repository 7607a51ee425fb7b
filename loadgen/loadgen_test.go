package loadgen

import (
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func TestPercentile(t *testing.T) {
	hundred := make(Latencies, 100)
	for i := range hundred {
		hundred[99-i] = ms(float64(i + 1)) // reversed: Percentile must sort
	}
	for _, tc := range []struct {
		name string
		l    Latencies
		q    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one sample is every percentile", Latencies{ms(7)}, 0.99, ms(7)},
		{"p50 of 1..100 is the 50th", hundred, 0.50, ms(50)},
		{"p99 of 1..100 is the 99th", hundred, 0.99, ms(99)},
		{"p100 is the max", hundred, 1, ms(100)},
		{"a tiny q is the min", hundred, 0.001, ms(1)},
		// Nearest rank: p50 of four samples is the second, never an interpolated 2.5.
		{"no interpolation", Latencies{ms(1), ms(2), ms(3), ms(4)}, 0.5, ms(2)},
		{"p99 of four is the max", Latencies{ms(4), ms(1), ms(3), ms(2)}, 0.99, ms(4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.Percentile(tc.q); got != tc.want {
				t.Fatalf("Percentile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
	if hundred[0] != ms(100) {
		t.Fatal("Percentile sorted its receiver in place")
	}
}

func TestRate(t *testing.T) {
	if got := rate(500, 2*time.Second); got != 250 {
		t.Fatalf("rate = %v", got)
	}
	if got := rate(5, 0); got != 0 {
		t.Fatalf("rate over nothing = %v", got)
	}
}

func TestMentionsNonce(t *testing.T) {
	for s, want := range map[string]bool{
		"invalid_exact_evm_nonce_already_used": true,
		"HTTP 200 x: nonce too low":            true,
		"Nonce":                                true,
		"invalid_exact_evm_signature":          false,
	} {
		if got := mentionsNonce("", s); got != want {
			t.Errorf("mentionsNonce(%q) = %v", s, got)
		}
	}
}

func sampleReport(withRef bool) *Report {
	r := &Report{
		Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Machine: "2 cores, Test CPU",
		FacilitatorURL: "http://127.0.0.1:4021", RPCURL: "http://127.0.0.1:8545",
		Token: newToken(common.HexToAddress("0x01"), "USD Coin", "2", 31337), HeadAtStart: 12,
		Ours: Side{Name: "ours", Signers: 4,
			Verify: &VerifyResult{Concurrency: 32, Elapsed: 10 * time.Second, Requests: 20000, Latencies: Latencies{ms(5), ms(10)}},
			Settle: &SettleResult{K: 1000, Concurrency: 64, Signers: 4, Elapsed: 4 * time.Second, Confirmed: 1000,
				Failed: 3, NonceErrors: 2, Latencies: Latencies{ms(200), ms(400)},
				Chain: ChainCount{Blocks: 300, Transfers: 1000, AuthorizationsUsed: 1000, SenderTxs: 1000}},
			Memory: &Memory{PID: 42, Peak: 64 << 20, HWM: 70 << 20, Samples: 10}},
		Replay:    &ReplayResult{N: 100, Replayed: 100, Latencies: Latencies{ms(0.5), ms(2)}},
		Ceiling:   []CeilingResult{{Mode: "one per request", N: 1000, Elapsed: time.Second, Chain: ChainCount{SenderTxs: 1000}}, {Mode: "batches of 100", N: 1000, Elapsed: 500 * time.Millisecond, Chain: ChainCount{SenderTxs: 1000}}},
		IndexNote: "not measured",
	}
	// Idle for 2 s: the facilitator's 10 ticks are 50 ms a second, with the node's and Postgres's 70.
	r.Ours.IdleCPU = cpuPhase(0, 10, 3, 1)
	r.Ours.IdleCPU.Elapsed = 2 * time.Second
	r.Ours.VerifyLevels = []VerifyLevel{
		// 500 verdicts: the facilitator's 100 ticks are 2 ms each, the node's 50 are 1 ms, Postgres's 5 are 0.1 ms.
		{Result: VerifyResult{Offered: 50, Concurrency: 32, Payments: 501, Sent: 500, Elapsed: 10 * time.Second, Requests: 500, Latencies: Latencies{ms(3), ms(8)}},
			CPU: cpuPhase(500, 100, 50, 5)},
		{Result: *r.Ours.Verify, CPU: cpuPhase(20000, 400, 300, 10)},
	}
	if withRef {
		r.Backfill = &BackfillResult{Network: "eip155:31337#bench-1", Stored: 100000, Elapsed: 2500 * time.Millisecond,
			Emitted: Emitted{DeployBlock: 570, Head: 787, Calls: 50, Events: 100000}}
		r.Ref = Side{Name: "official", Signers: 1, IdleCPU: &CPUPhase{ClkTck: 100, Elapsed: 2 * time.Second,
			Roles: []RoleCPU{{Role: RoleFacilitator, Ticks: 40}, {Role: RoleNode, Ticks: 2}, {Role: RolePostgres, Err: "n/a (no database)"}}},
			VerifyLevels: []VerifyLevel{
				{Result: VerifyResult{Offered: 50, Concurrency: 32, Payments: 501, Sent: 500, Elapsed: 10 * time.Second, Requests: 500, Latencies: Latencies{ms(40)}},
					CPU: cpuPhase(500, 3000, 300, 0)},
			},
			Verify: &VerifyResult{Concurrency: 32, Elapsed: 10 * time.Second, Requests: 1000, Latencies: Latencies{ms(50), ms(100)}},
			Settle: &SettleResult{K: 200, Concurrency: 64, Signers: 1, Elapsed: 4 * time.Second, Confirmed: 200, Latencies: Latencies{ms(800), ms(1600)},
				Chain: ChainCount{Transfers: 200, SenderTxs: 200}}}
	}
	return r
}

// cpuPhase is a phase of ops operations in which the facilitator, the node and Postgres spent
// the given ticks (at 100 a second) and the load generator none.
func cpuPhase(ops int, fac, node, pg uint64) *CPUPhase {
	return &CPUPhase{Ops: ops, ClkTck: 100, Roles: []RoleCPU{
		{Role: RoleFacilitator, Ticks: fac}, {Role: RoleNode, Ticks: node}, {Role: RolePostgres, Ticks: pg}, {Role: RoleLoadgen}}}
}

func TestRender(t *testing.T) {
	var b strings.Builder
	if err := Render(&b, sampleReport(true)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	lines := strings.Split(out, "\n")
	find := func(prefix string) []string {
		t.Helper()
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), prefix))
			}
		}
		t.Fatalf("no line %q in:\n%s", prefix, out)
		return nil
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		// 20000/10s = 2000/s against 100/s: 20x; latencies official/ours.
		{"valid verdicts/s", []string{"2000.0/s", "100.0/s", "20.00x"}},
		{"latency p50", []string{"5.00", "ms", "50.0", "ms", "10.00x"}},
		{"settlements/s", []string{"250.0/s", "50.0/s", "5.00x"}},
		{"latency to confirmed p99", []string{"400", "ms", "1600", "ms", "4.00x"}},
		{"signer keys", []string{"4", "1"}},
		{"nonce errors (answers)", []string{"2", "0"}},
		{"other failed answers", []string{"1", "0"}},
		{"on-chain transfers (of K)", []string{"1000", "/", "1000", "200", "/", "200"}},
		// The ceiling is the better mode, 2000/s: 250/s is 12.5 % of it, 50/s is 2.5 %.
		{"settle rate as % of the ceiling", []string{"12.5%", "2.5%"}},
		{"peak VmRSS", []string{"64.0", "MiB", "(pid", "42)", "not", "sampled"}},
		// The backfill replaces the note: 100,000 events in 2.5 s, blocks 570..787 inclusive.
		{"events/s", []string{"40000.0/s"}},
		{"events stored / emitted", []string{"100000", "/", "100000", "(50", "emitMany", "transactions)"}},
		{"blocks read", []string{"218", "(570..787)"}},
		{"time", []string{"2500", "ms"}},
		// The arrival rates: the first level on both sides, the second ours only.
		{"50/s offered (at most 32 outstanding), 10s: valid verdicts/s", []string{"50.0/s", "50.0/s"}},
		{"payments sent / signed, failed", []string{"500", "/", "501,", "0", "500", "/", "501,", "0"}},
		{"facilitator CPU", []string{"2.000", "ms", "60.0", "ms", "0.033x"}},
		{"facilitator + chain node + Postgres CPU", []string{"3.100", "ms", "66.0", "ms", "0.047x"}},
		{"concurrency 32, 10s: valid verdicts/s", []string{"2000.0/s", "—"}},
	} {
		if got := find(tc.prefix); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: %q, want %q", tc.prefix, got, tc.want)
		}
	}
	for _, s := range []string{"2 cores, Test CPU", "reference settled K=200", "ours/official for rates",
		"/verify by arrival rate: distinct payments, each verified once",
		// Idle CPU per second, ours and the official's (whose Postgres is not measured).
		"idle, 2s with no request before the first rate: CPU ms per second",
		"facilitator 50.0 ms 200.0 ms", "facilitator + chain node + Postgres 70.0 ms 210.0 ms"} {
		if !strings.Contains(squeezeSpaces(out), s) {
			t.Errorf("output lacks %q", s)
		}
	}
	// Columns line up: every figure row puts the official column at the same offset.
	col := strings.Index(lines[5], "official")
	for _, l := range lines[6:] {
		if strings.HasPrefix(l, "  ") && len(l) > col && strings.Contains(l, "/s ") && l[col-1] != ' ' {
			t.Errorf("misaligned row %q", l)
		}
	}
}

func TestRenderWithoutReference(t *testing.T) {
	var b strings.Builder
	if err := Render(&b, sampleReport(false)); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "not run") || strings.Contains(out, "ours/official") {
		t.Fatalf("a run without the reference must say so and print no ratios:\n%s", out)
	}
	if out := b.String(); !strings.Contains(out, "indexer backfill events/s: not measured") {
		t.Fatalf("a run without the backfill must print its note:\n%s", out)
	}
}
