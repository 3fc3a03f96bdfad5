#!/usr/bin/env bash
# Takes docs/status.png: `relay-dev`'s status page in headless Chromium while the relay is
# detached in the scripted outage after its first recovery, so that the page shows why, the
# outage history and the rates. Needs chromium (apt-get install chromium fonts-dejavu-core).
# Usage: docs/status-screenshot.sh [output.png]
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-docs/status.png}")
tmp=$(mktemp -d)
trap 'kill "$dev" 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/relay-dev" ./cmd/relay-dev
"$tmp/relay-dev" --duration 120s >"$tmp/dev.out" 2>&1 &
dev=$!
status=
for _ in $(seq 100); do
  status=$(grep -o 'http://[0-9.:]*/status' "$tmp/dev.out" | head -1 || true)
  [ -n "$status" ] && break
  sleep 0.2
done
[ -n "$status" ] || { echo "relay-dev printed no status address:"; cat "$tmp/dev.out"; exit 1; }
# The second outage: after the first recovery, and then detached again.
until grep -q 'outage 2:' "$tmp/dev.out"; do sleep 0.2; done
until curl -fs "$status.json" | grep -q '"reason"'; do sleep 0.2; done
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$tmp/profile" --hide-scrollbars \
  --window-size=1200,1700 --screenshot="$out" "$status" 2>/dev/null
echo "wrote $out"
