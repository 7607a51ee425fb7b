#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a while each, one after the other, and prints a
# summary table (target, execs, new interesting inputs, result). Not part of 'make test': the
# seeds of these targets already run there; this is the long run.
#
#   scripts/fuzz.sh [seconds per target, default 60]
#
# Environment:
#   FUZZ_ONLY=regexp     run only the targets whose "package.FuzzName" matches
#   FUZZ_OUT=dir         where logs and new failing inputs go (default: a fresh /tmp directory)
#   FUZZ_MINIMIZE=5s     -fuzzminimizetime: go test's default (60s) spends most of a short run
#                        minimizing each new interesting input, with no execs counted meanwhile
#
# The api, status and notify test binaries start anvil in TestMain (node_modules is installed
# first), and status and notify also recreate their Postgres database there: every fuzz worker is
# a new process running TestMain, so those packages fuzz with one worker, or the workers would
# drop each other's database while starting. Failing inputs are moved out of the tree into
# FUZZ_OUT; copy one back to <package>/testdata/fuzz/<FuzzName>/ to replay it with
# 'go test ./<package> -run <FuzzName>/<file>'.
set -uo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
case "$secs" in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [seconds]" >&2; exit 2 ;; esac
out="${FUZZ_OUT:-$(mktemp -d /tmp/x402-fuzz.XXXXXX)}"
mkdir -p "$out"
log() { echo "fuzz.sh: $*" >&2; }

scripts/npm.sh >&2 || { log "npm install failed: the api, status and notify targets need anvil"; exit 1; }
if [ -z "${TEST_DATABASE_URL:-}" ]; then
  if ! TEST_DATABASE_URL="$(scripts/postgres.sh x402_fuzz)"; then
    log "no Postgres: the status and notify targets need one (set TEST_DATABASE_URL or PG_ADMIN_URL)"
    exit 1
  fi
fi
export TEST_DATABASE_URL

# Every "package FuzzName" pair, in a stable order.
mapfile -t targets < <(
  grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --exclude-dir=node_modules --exclude-dir=.git . |
    while read -r file; do
      dir="$(dirname "$file")"
      grep -oE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' |
        while read -r name; do echo "${dir#./} $name"; done
    done | sort -u
)
if [ -n "${FUZZ_ONLY:-}" ]; then
  mapfile -t targets < <(printf '%s\n' "${targets[@]}" | awk '{print $1"."$2" "$0}' | grep -E "^[^ ]*${FUZZ_ONLY}" | cut -d' ' -f2-)
fi
[ "${#targets[@]}" -gt 0 ] || { log "no fuzz targets"; exit 1; }

# oneWorker: the package's TestMain recreates a database (see above).
oneWorker() {
  grep -l 'func TestMain' "$1"/*_test.go 2>/dev/null | xargs -r grep -lE 'stacktest\.(Main\(|FreshDB)' | grep -q .
}

log "${#targets[@]} targets, ${secs}s each; logs in $out"
results=()
failed=0
for t in "${targets[@]}"; do
  pkg="${t% *}" name="${t#* }"
  corpus="$pkg/testdata/fuzz/$name"
  before="$(ls "$corpus" 2>/dev/null | sort)"
  par=()
  if oneWorker "$pkg"; then par=(-parallel 1); fi
  logf="$out/${pkg//\//_}.$name.log"
  log "$pkg $name ${par[*]}"
  start=$(date +%s)
  go test "./$pkg" -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" -fuzzminimizetime "${FUZZ_MINIMIZE:-5s}" -timeout "$((secs + 600))s" "${par[@]}" >"$logf" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  last="$(grep -E '^fuzz: elapsed' "$logf" | tail -1)"
  execs="$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")"
  interesting="$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")"
  result=PASS
  if [ "$rc" -ne 0 ]; then
    result=FAIL
    failed=$((failed + 1))
    # The first line that says why, without the file:line prefix's indentation.
    why="$(grep -m1 -E '^\s+[a-z_]+_test\.go:[0-9]+: |panic: |fuzzing process' "$logf" | sed -E 's/^\s+//' | cut -c1-160)"
    [ -n "$why" ] && result="FAIL: $why"
  fi
  # New failing inputs leave the tree (see above).
  after="$(ls "$corpus" 2>/dev/null | sort)"
  for f in $(comm -13 <(echo "$before") <(echo "$after")); do
    mkdir -p "$out/testdata/$pkg/$name"
    mv "$corpus/$f" "$out/testdata/$pkg/$name/"
    result="$result [input: $out/testdata/$pkg/$name/$f]"
  done
  rmdir -p "$corpus" 2>/dev/null
  results+=("$(printf '%-40s %12s %12s %6ss  %s' "$pkg.$name" "${execs:--}" "${interesting:--}" "$took" "$result")")
done

echo
printf '%-40s %12s %12s %7s  %s\n' "target" "execs" "interesting" "time" "result"
printf '%s\n' "${results[@]}"
echo
echo "$((${#targets[@]} - failed))/${#targets[@]} targets passed ${secs}s of fuzzing each; logs in $out"
[ "$failed" -eq 0 ]
