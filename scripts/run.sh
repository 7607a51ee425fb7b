#!/usr/bin/env bash
# The local stack: Postgres, anvil with Circle's USDC deployed and funded, and the facilitator.
# Ctrl-C stops anvil and the facilitator (Postgres is the machine's own cluster and stays up).
# facilitator-dev serves with the production binary it finds beside it, so both are built into bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/npm.sh
go build -o bin/ ./cmd/facilitator ./cmd/facilitator-dev
# Before the database is recreated: a stack already running (its anvil, its facilitator) would lose
# its ledger to --fresh, and a new anvil cannot take the port anyway.
bin/facilitator-dev dev --check-ports "$@"
DATABASE_URL="$(scripts/postgres.sh x402_dev --fresh)"
export DATABASE_URL
exec bin/facilitator-dev dev "$@"
