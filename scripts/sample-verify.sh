#!/usr/bin/env bash
# Sends the sample payment in examples/verify-v2.json to a facilitator's POST /verify and
# pretty-prints the answer. The sample is signed by dev account #1 for the local stack's USDC on
# chain 31337, so it verifies as valid against 'make run' (facilitator-dev dev):
#
#   scripts/sample-verify.sh [URL]      URL defaults to http://127.0.0.1:4021
set -euo pipefail
cd "$(dirname "$0")/.."
url="${1:-http://127.0.0.1:4021}"
url="${url%/}"

body=$(curl -sS -X POST "$url/verify" \
  -H 'Content-Type: application/json' \
  --data-binary @examples/verify-v2.json \
  -w '\n%{http_code}')
status="${body##*$'\n'}"
body="${body%$'\n'*}"
body="${body%$'\n'}"

echo "POST $url/verify -> HTTP $status" >&2
if command -v python3 >/dev/null && printf '%s' "$body" | python3 -m json.tool 2>/dev/null; then
  :
else
  printf '%s\n' "$body"
fi
[ "$status" = 200 ]
