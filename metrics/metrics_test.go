package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestScrapeTimeMetrics registers every scrape-time source with fixed readings and holds the
// exposition text: names, help, labels, and which series are absent when the reading is unknown.
func TestScrapeTimeMetrics(t *testing.T) {
	m := New()
	readAt := time.Unix(1700000000, 500000000)
	m.WatchSigners(func() []Signer {
		return []Signer{
			{Network: "eip155:1337", Address: "0xaa", InFlight: 3, BalanceKnown: true, BalanceWei: 5e18,
				BalanceLow: true, BalanceReadAt: readAt, MinBalanceWei: 1e17, Held: true, Open: 4},
			{Network: "eip155:1337", Address: "0xbb", InFlight: 0, Retiring: true},
		}
	})
	m.WatchIndexers(func() []Indexer {
		return []Indexer{
			{Network: "eip155:1337", Leader: true, Lag: 7},
			{Network: "eip155:8453", Stopped: true, Lag: 99},
		}
	})
	m.WatchEndpoints(func() []Endpoint {
		return []Endpoint{
			{Network: "eip155:1337", Name: "rpc0", Up: true, Head: 1234},
			{Network: "eip155:1337", Name: "rpc1"},
		}
	})
	m.WatchSettlements(func() []Open {
		return []Open{
			{Network: "eip155:1337", State: "broadcast", Count: 2, Oldest: 1500 * time.Millisecond},
			{Network: "eip155:1337", State: "mined"},
		}
	})
	m.WatchPaymentIDs(func() (int64, int64) { return 4, 9 })
	m.WatchClaims(func() uint64 { return 2 })

	const want = `
# HELP facilitator_indexer_lag_blocks Blocks between the chain head and the last indexed block (only where this process leads the indexer).
# TYPE facilitator_indexer_lag_blocks gauge
facilitator_indexer_lag_blocks{network="eip155:1337"} 7
# HELP facilitator_indexer_leader 1 when this process leads the network's indexer.
# TYPE facilitator_indexer_leader gauge
facilitator_indexer_leader{network="eip155:1337"} 1
facilitator_indexer_leader{network="eip155:8453"} 0
# HELP facilitator_indexer_stopped 1 when the network's indexer stopped and needs an operator.
# TYPE facilitator_indexer_stopped gauge
facilitator_indexer_stopped{network="eip155:1337"} 0
facilitator_indexer_stopped{network="eip155:8453"} 1
# HELP facilitator_payment_id_conflicts_total Requests that reused a payment identifier bound to a different payment.
# TYPE facilitator_payment_id_conflicts_total counter
facilitator_payment_id_conflicts_total 4
# HELP facilitator_payment_id_replays_total Requests answered from an earlier request under the same payment identifier.
# TYPE facilitator_payment_id_replays_total counter
facilitator_payment_id_replays_total 9
# HELP facilitator_rpc_endpoint_head The highest block number the RPC endpoint answered.
# TYPE facilitator_rpc_endpoint_head gauge
facilitator_rpc_endpoint_head{endpoint="rpc0",network="eip155:1337"} 1234
# HELP facilitator_rpc_endpoint_up 1 when the RPC endpoint's last call answered; 0 from a failure until it answers again.
# TYPE facilitator_rpc_endpoint_up gauge
facilitator_rpc_endpoint_up{endpoint="rpc0",network="eip155:1337"} 1
facilitator_rpc_endpoint_up{endpoint="rpc1",network="eip155:1337"} 0
# HELP facilitator_settlement_oldest_open_seconds Age of the oldest open settlement in the state, from its first signature (absent when none).
# TYPE facilitator_settlement_oldest_open_seconds gauge
facilitator_settlement_oldest_open_seconds{network="eip155:1337",state="broadcast"} 1.5
# HELP facilitator_settlements_open Settlements this process works on, by state: signed, broadcast (no receipt yet), mined (waiting for finality).
# TYPE facilitator_settlements_open gauge
facilitator_settlements_open{network="eip155:1337",state="broadcast"} 2
facilitator_settlements_open{network="eip155:1337",state="mined"} 0
# HELP facilitator_signer_balance_low 1 when the signer key's balance is below its alert threshold (absent when unknown).
# TYPE facilitator_signer_balance_low gauge
facilitator_signer_balance_low{network="eip155:1337",signer="0xaa"} 1
# HELP facilitator_signer_balance_min_wei The balance below which the signer key takes no new settlement, in wei (0: no minimum).
# TYPE facilitator_signer_balance_min_wei gauge
facilitator_signer_balance_min_wei{network="eip155:1337",signer="0xaa"} 1e+17
facilitator_signer_balance_min_wei{network="eip155:1337",signer="0xbb"} 0
# HELP facilitator_signer_balance_read_timestamp_seconds When the signer key's balance was last read (Unix seconds; absent before the first read).
# TYPE facilitator_signer_balance_read_timestamp_seconds gauge
facilitator_signer_balance_read_timestamp_seconds{network="eip155:1337",signer="0xaa"} 1.7000000005e+09
# HELP facilitator_signer_balance_wei The signer key's native balance, in wei (absent when unknown).
# TYPE facilitator_signer_balance_wei gauge
facilitator_signer_balance_wei{network="eip155:1337",signer="0xaa"} 5e+18
# HELP facilitator_signer_in_flight Settlement transactions signed and not yet resolved, per signer key.
# TYPE facilitator_signer_in_flight gauge
facilitator_signer_in_flight{network="eip155:1337",signer="0xaa"} 3
facilitator_signer_in_flight{network="eip155:1337",signer="0xbb"} 0
# HELP facilitator_signer_open_settlements Settlements of the signer key this process still works (signed, broadcast, or mined and not yet final); absent where another process holds the key. A retiring key at 0 is drained.
# TYPE facilitator_signer_open_settlements gauge
facilitator_signer_open_settlements{network="eip155:1337",signer="0xaa"} 4
# HELP facilitator_signer_retiring 1 when the signer key is retiring (--retire-signers): it takes no new settlement and finishes what it has open.
# TYPE facilitator_signer_retiring gauge
facilitator_signer_retiring{network="eip155:1337",signer="0xaa"} 0
facilitator_signer_retiring{network="eip155:1337",signer="0xbb"} 1
# HELP facilitator_success_claims_lapsed_total Successes answered whose claim lapsed before its confirmation was recorded: each may have been answered to a second caller.
# TYPE facilitator_success_claims_lapsed_total counter
facilitator_success_claims_lapsed_total 2
`
	names := []string{
		"facilitator_indexer_lag_blocks", "facilitator_indexer_leader", "facilitator_indexer_stopped",
		"facilitator_payment_id_conflicts_total", "facilitator_payment_id_replays_total",
		"facilitator_rpc_endpoint_head", "facilitator_rpc_endpoint_up",
		"facilitator_settlement_oldest_open_seconds", "facilitator_settlements_open",
		"facilitator_signer_balance_low", "facilitator_signer_balance_min_wei",
		"facilitator_signer_balance_read_timestamp_seconds", "facilitator_signer_balance_wei",
		"facilitator_signer_in_flight", "facilitator_signer_open_settlements", "facilitator_signer_retiring",
		"facilitator_success_claims_lapsed_total",
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// The registry checks each collector's Describe against what it collects, so a lint-clean
	// gather also says every collected series was described.
	if problems, err := testutil.GatherAndLint(m.Registry(), names...); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
}

// TestBuildInfo: facilitator_build_info is 1 with the build's labels.
func TestBuildInfo(t *testing.T) {
	m := New()
	m.SetBuildInfo("v1.2.3", "04aeb06", "go1.26.0")
	const want = `
# HELP facilitator_build_info Always 1; the labels say which build this process runs: the module version, the VCS revision and the Go version.
# TYPE facilitator_build_info gauge
facilitator_build_info{go_version="go1.26.0",revision="04aeb06",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "facilitator_build_info"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(m.Registry(), "facilitator_build_info"); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
}
