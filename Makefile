.PHONY: test run demo drill build fuzz bench bench-settle bench-replay bench-index bench-load

# Run every test on real Postgres and anvil (installs npm packages and starts Postgres itself).
test:
	scripts/test.sh -race

# Start the local stack: Postgres, anvil with USDC, the facilitator on 127.0.0.1:4021 with four
# signer keys (one key sends one transaction at a time and would cap the settle rate).
run:
	scripts/run.sh --signers 4

# The lost-response story on a fresh local stack: an agent pays, the answer is lost, the retry with the
# same payment id gets it without paying twice; then the ledger is checked against the chain.
demo:
	scripts/npm.sh && go build -o bin/ ./cmd/facilitator ./cmd/facilitator-dev \
	  && DATABASE_URL="$$(scripts/postgres.sh x402_demo --fresh)" bin/facilitator-dev demo

# The database failover and restore drills (docs/operating.md): Postgres clusters of their own,
# so run as root; about 150 s. Prints each drill's figures.
drill:
	scripts/npm.sh && CI=true go test -count=1 -timeout 15m ./cmd/facilitator -run '^TestDatabaseFailoverDrill$$' -drill -v

# The production binary (bin/facilitator) and the dev tools beside it (bin/facilitator-dev).
build:
	go build -o bin/ ./cmd/facilitator ./cmd/facilitator-dev

# Every fuzz target for FUZZTIME seconds each (default 60), one after the other, then a summary
# table (target, execs, new interesting, result). Needs anvil and Postgres like 'make test'.
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# Benchmark /verify of a valid payload against anvil.
bench:
	scripts/npm.sh && go test ./api/ -run '^$$' -bench BenchmarkVerify -benchtime 2000x

# Settle K distinct payments at concurrency C against anvil (auto-mine) through the engine and the
# real ledger; prints settlements/s and the on-chain transfer count (must equal K).
bench-settle:
	scripts/npm.sh && TEST_DATABASE_URL="$$(scripts/postgres.sh x402_test)" go test ./settle/ -run '^$$' -bench BenchmarkSettle -benchtime 1x -settle.k 1000 -settle.c 64

# Latency of a payment-identifier replay of /settle over HTTP (p50, p99).
bench-replay:
	scripts/npm.sh && TEST_DATABASE_URL="$$(scripts/postgres.sh x402_test)" go test ./paymentid/ -run '^$$' -bench BenchmarkReplay -benchtime 2000x

# Backfill throughput: 100,000 events indexed from anvil into Postgres (events/s).
bench-index:
	scripts/npm.sh && TEST_DATABASE_URL="$$(scripts/postgres.sh x402_test)" go test ./loadgen/ -run '^$$' -bench BenchmarkBackfill -benchtime 1x

# Load test of the RUNNING local stack ('make run' in another shell): /verify and /settle under
# load beside the official TypeScript facilitator on the same anvil, payment-identifier replays,
# the chain's own ceiling, peak RSS and, last, the indexer's backfill of 100,000 events into a
# fresh database of its own (not the stack's x402_dev ledger), as one table (method and figures:
# BENCHMARKS.md). Flags go in BENCH_FLAGS, e.g.
# BENCH_FLAGS="--url http://127.0.0.1:4021 --rpc http://127.0.0.1:8545 --k 500 --backfill=false".
bench-load:
	scripts/npm.sh && go run ./cmd/facilitator-dev bench --database-url "$$(scripts/postgres.sh x402_bench_index --fresh)" $(BENCH_FLAGS)
