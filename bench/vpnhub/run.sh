#!/usr/bin/env bash
# The VPN hub benchmark (not run in CI). As root, from the repository root:
#   bash bench/vpnhub/run.sh [-duration 10s] [-repeat 3] [...flags of `vpnhub run`]
# It installs what it needs (Debian: iproute2, iperf3, wireguard-tools, iputils-ping; wireguard-go
# from the Go module proxy into /tmp/wgbin, never into this module), builds the benchmark, runs it,
# and measures the forward path's allocations. Results go to stdout; bench/results/vpnhub.md keeps
# the figures with machine, date and command.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "run as root: network namespaces and TUN" >&2; exit 2; }
export GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOTOOLCHAIN=local

need=()
for t in ip:iproute2 iperf3:iperf3 wg:wireguard-tools ping:iputils-ping; do
  command -v "${t%%:*}" >/dev/null 2>&1 || need+=("${t##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
WIREGUARD_GO=golang.zx2c4.com/wireguard@v0.0.0-20260522210424-ecfc5a8d5446
[ -x /tmp/wgbin/wireguard ] || (cd /tmp && GOFLAGS= GOBIN=/tmp/wgbin go install "$WIREGUARD_GO")

go build -o /tmp/vpnhub-bench ./bench/vpnhub
echo "# command: bash bench/vpnhub/run.sh $*"
echo "# wireguard-go: $WIREGUARD_GO ($(/tmp/wgbin/wireguard --version 2>&1 | head -n1))"
echo "# $(uname -r), $(iperf3 --version | head -n1)"
/tmp/vpnhub-bench run -wireguard /tmp/wgbin/wireguard "$@"
echo
echo "## forward path allocations and cost (go test)"
go test ./vpnhub -run 'TestForwardPathAllocatesNothing' -bench 'BenchmarkForwardPath' -benchmem -count 1 -v | grep -E '^(---|Benchmark|ok)'
