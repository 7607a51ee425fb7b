#!/usr/bin/env bash
# The local stack: Postgres, anvil with Circle's USDC deployed and funded, and the facilitator.
# Ctrl-C stops anvil and the facilitator (Postgres is the machine's own cluster and stays up).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/npm.sh
DATABASE_URL="$(scripts/postgres.sh x402_dev --fresh)"
export DATABASE_URL
exec go run ./cmd/facilitator dev "$@"
