#!/usr/bin/env bash
# Lints the chart and compares `helm template` with the golden files in testdata/.
# Usage: charts/relay/test.sh [helm binary] [--update]
set -euo pipefail
cd "$(dirname "$0")"
helm=${1:-helm}
update=${2:-}
"$helm" lint --strict . -f testdata/ci-values.yaml
"$helm" lint --strict . -f testdata/ci-values.yaml --set grafana.dashboard.enabled=true
render() { "$helm" template relay . --namespace relay-system --kube-version 1.31.0 "$@"; }
check() {
  local name=$1; shift
  if [ "$update" = "--update" ]; then
    render "$@" > "testdata/$name.golden.yaml"
  elif ! diff -u "testdata/$name.golden.yaml" <(render "$@"); then
    echo "helm template differs from testdata/$name.golden.yaml (run charts/relay/test.sh helm --update if intended)"
    exit 1
  fi
}
check full -f testdata/ci-values.yaml
check minimal -f testdata/ci-values.yaml --set hub.enabled=false --set registry.upstream= --set serviceMonitor.enabled=false
check privileged-port -f testdata/ci-values.yaml --set downstream.port=443
check dashboard -f testdata/ci-values.yaml --set grafana.dashboard.enabled=true --show-only templates/grafana-dashboard.yaml
# The ConfigMap carries dashboards/relay.json byte for byte, under the sidecar's label, in the
# namespace asked for.
dashboard=$(render -f testdata/ci-values.yaml --set grafana.dashboard.enabled=true --set grafana.dashboard.namespace=monitoring \
  --set grafana.dashboard.labelKey=dashboards --set grafana.dashboard.labelValue=relay --show-only templates/grafana-dashboard.yaml)
if ! diff -u dashboards/relay.json <(sed -n '/^  relay.json: |-$/,$p' <<<"$dashboard" | tail -n +2 | sed 's/^    //'); then
  echo "the dashboard ConfigMap does not carry dashboards/relay.json as it is"; exit 1
fi
grep -q '^  namespace: monitoring$' <<<"$dashboard" || { echo "grafana.dashboard.namespace is not the ConfigMap's"; exit 1; }
grep -q '^    dashboards: "relay"$' <<<"$dashboard" || { echo "grafana.dashboard.labelKey/labelValue is not on the ConfigMap"; exit 1; }
# A missing required value fails, naming it.
if out=$(render 2>&1); then echo "rendering without values succeeded"; exit 1; fi
grep -q "clusterId is required" <<<"$out" || { echo "unexpected error: $out"; exit 1; }
# The admin port is on no Service but the ServiceMonitor's, and the NetworkPolicy must admit
# Prometheus to it.
if render -f testdata/ci-values.yaml --show-only templates/service.yaml | grep -q "port: admin\|name: admin"; then
  echo "the relay's Service exposes the admin port"; exit 1
fi
if out=$(render -f testdata/ci-values.yaml --set networkPolicy.adminFrom=null 2>&1); then
  echo "a ServiceMonitor behind a NetworkPolicy that admits no one rendered"; exit 1
fi
grep -q "networkPolicy.adminFrom" <<<"$out" || { echo "unexpected error: $out"; exit 1; }
echo "chart: lint and golden templates ok"
