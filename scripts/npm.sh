#!/usr/bin/env bash
# Installs the pinned npm packages (anvil, Circle's compiled USDC, the official x402 packages)
# when node_modules is missing or older than the lockfile.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
echo "npm.sh: installing pinned npm packages (npm ci)" >&2
npm ci --no-audit --no-fund >&2
