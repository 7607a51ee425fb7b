#!/usr/bin/env bash
# The test command: installs what the tests need, starts Postgres, and runs every Go test against
# real Postgres and real anvil with Circle's USDC. Extra arguments go to 'go test'.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/npm.sh
scripts/promtool.sh
scripts/chromium.sh
TEST_DATABASE_URL="$(scripts/postgres.sh x402_test --fresh)"
export TEST_DATABASE_URL
echo "test.sh: Postgres at ${TEST_DATABASE_URL%%\?*}" >&2
go vet ./...
go test -count=1 -timeout 20m "$@" ./...
# The simulator's full budget of seeds (1,000), without the race detector, which slows it sixfold
# and finds nothing in its one goroutine (under -race above it runs a smoke run of 50).
go test -count=1 -timeout 10m ./settle/ -run '^TestSimulation$' -sim.seeds 1000
