#!/usr/bin/env bash
# Makes sure a Postgres server is up and a database exists for the facilitator, then prints its
# connection URL on stdout (everything else goes to stderr).
#
#   scripts/postgres.sh <database> [--fresh]
#
# If PG_ADMIN_URL is set, that server is used as is (it must allow CREATE DATABASE). Otherwise,
# as root, the machine's Postgres 15 cluster is started with pg_ctlcluster and a role "x402" is
# created on it. --fresh drops and recreates the database (the local stack starts from an empty
# ledger, like its fresh chain).
set -euo pipefail
db="${1:?usage: scripts/postgres.sh <database> [--fresh]}"
fresh="${2:-}"
log() { echo "postgres.sh: $*" >&2; }

if [ -n "${PG_ADMIN_URL:-}" ]; then
  admin=(psql "$PG_ADMIN_URL" -v ON_ERROR_STOP=1 -qAt)
  base="${PG_ADMIN_URL%/*}"
else
  if [ "$(id -u)" -ne 0 ]; then
    log "not root: set PG_ADMIN_URL to a Postgres you can create databases on (postgres://user:pass@host:port/postgres)"
    exit 1
  fi
  ver=15
  if ! command -v pg_ctlcluster >/dev/null; then
    log "Postgres is not installed; installing postgresql-$ver"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$ver" >&2
  fi
  if ! pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main"' | grep -q .; then
    log "creating cluster $ver/main"
    pg_createcluster "$ver" main >&2
  fi
  if ! pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" && $4=="online"' | grep -q .; then
    log "starting cluster $ver/main"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2
  fi
  port=$(pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $3}')
  for _ in $(seq 1 50); do
    runuser -u postgres -- pg_isready -q -p "$port" && break
    sleep 0.2
  done
  admin=(runuser -u postgres -- psql -p "$port" -v ON_ERROR_STOP=1 -qAt)
  if [ "$("${admin[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname='x402'")" != "1" ]; then
    "${admin[@]}" -c "CREATE ROLE x402 LOGIN CREATEDB PASSWORD 'x402'" >&2
  fi
  base="postgres://x402:x402@127.0.0.1:$port"
fi

if [ "$fresh" = "--fresh" ]; then
  "${admin[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >&2
fi
if [ "$("${admin[@]}" -c "SELECT 1 FROM pg_database WHERE datname='$db'")" != "1" ]; then
  owner=""
  [ -z "${PG_ADMIN_URL:-}" ] && owner="OWNER x402"
  "${admin[@]}" -c "CREATE DATABASE \"$db\" $owner" >&2
fi
echo "$base/$db?sslmode=disable"
