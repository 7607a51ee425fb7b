#!/usr/bin/env bash
# The local stack: Postgres, anvil with Circle's USDC deployed and funded, and the facilitator.
# Ctrl-C stops anvil and the facilitator (Postgres is the machine's own cluster and stays up).
# facilitator-dev serves with the production binary it finds beside it, so both are built into bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/npm.sh
DATABASE_URL="$(scripts/postgres.sh x402_dev --fresh)"
export DATABASE_URL
go build -o bin/ ./cmd/facilitator ./cmd/facilitator-dev
exec bin/facilitator-dev dev "$@"
