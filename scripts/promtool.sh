#!/usr/bin/env bash
# Installs Prometheus's promtool, which deploy/'s tests run on the alerting rules
# (promtool check rules, promtool test rules). Idempotent: nothing happens when promtool is on
# PATH. Only the binary is taken from Debian's prometheus package (apt-get download, dpkg-deb -x):
# installing the package would also enable and start a Prometheus daemon.
set -euo pipefail
log() { echo "promtool.sh: $*" >&2; }
if command -v promtool >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  log "promtool is missing and this is not root: install it (Debian: the prometheus package's /usr/bin/promtool); deploy/'s rule tests skip without it, and fail under CI=true"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt-get download runs as _apt, which must write here
log "installing promtool from Debian's prometheus package"
apt-get update -qq >&2
(cd "$tmp" && apt-get download -qq prometheus >&2)
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
install -m 0755 "$tmp/root/usr/bin/promtool" /usr/local/bin/promtool
promtool --version >&2
