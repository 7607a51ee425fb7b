package facilitator

import "time"

// The rows the ledger aggregates for the operations overview (ops/): every replica's settlements,
// settlement times and webhook deliveries, and the reconcile jobs' runs.

// MinuteCount is how many settlements created in one minute are now in one state.
type MinuteCount struct {
	Minute time.Time
	State  State
	Count  int
}

// Percentiles are a distribution's p50, p90 and p99 over Count samples (zero when Count is 0).
type Percentiles struct {
	Count         int
	P50, P90, P99 time.Duration
}

// SettlementTimes is how long settlements took from signed to mined and to final.
type SettlementTimes struct {
	ToMined, ToFinal Percentiles
}

// DeliveryCounts are webhook deliveries by result, and by the class of the receiver's last HTTP
// status ("2xx", "4xx", "5xx", "none" when it never answered).
type DeliveryCounts struct {
	Delivered, Retrying, GaveUp int
	ByStatusClass               map[string]int
}

// ReconcileRun is one run of a reconcile job as it recorded itself.
type ReconcileRun struct {
	ID       int64
	Job      string
	Network  string // "" when the run covered every network
	Started  time.Time
	Finished time.Time
	Examined int
	// Changed counts what the run changed, by kind (mined, final, reopened, …); kinds it did not
	// change are absent.
	Changed map[string]int
	// Error is the run's failure, scrubbed of URLs; "" when it succeeded.
	Error string
}
