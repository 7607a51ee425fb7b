#!/usr/bin/env bash
# Installs Debian's chromium, the headless browser console/'s tests drive (chromedp). Idempotent:
# nothing happens when chromium is on PATH; without root it only says what is missing (the browser
# tests skip without it, and fail under CI=true).
set -euo pipefail
log() { echo "chromium.sh: $*" >&2; }
if command -v chromium >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  log "chromium is missing and this is not root: install it (Debian: apt-get install chromium) or set CHROMIUM to a Chrome binary; console/'s browser tests skip without it, and fail under CI=true"
  exit 0
fi
log "installing Debian's chromium"
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
chromium --version >&2
