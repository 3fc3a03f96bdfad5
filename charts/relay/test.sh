#!/usr/bin/env bash
# Lints the chart and compares `helm template` with the golden files in testdata/.
# Usage: charts/relay/test.sh [helm binary] [--update]
set -euo pipefail
cd "$(dirname "$0")"
helm=${1:-helm}
update=${2:-}
"$helm" lint --strict . -f testdata/ci-values.yaml
"$helm" lint --strict . -f testdata/ci-values.yaml --set grafana.dashboard.enabled=true
"$helm" lint --strict . -f testdata/ci-values.yaml -f testdata/ha-values.yaml
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
check ha -f testdata/ci-values.yaml -f testdata/ha-values.yaml
check prometheusrule -f testdata/ci-values.yaml -f testdata/ha-values.yaml --set prometheusRule.enabled=true --show-only templates/prometheusrule.yaml
check extras -f testdata/ci-values.yaml -f testdata/ha-values.yaml -f testdata/extras-values.yaml --show-only templates/deployment.yaml
# The ConfigMap carries dashboards/relay.json byte for byte, under the sidecar's label, in the
# namespace asked for.
dashboard=$(render -f testdata/ci-values.yaml --set grafana.dashboard.enabled=true --set grafana.dashboard.namespace=monitoring \
  --set grafana.dashboard.labelKey=dashboards --set grafana.dashboard.labelValue=relay --show-only templates/grafana-dashboard.yaml)
if ! diff -u dashboards/relay.json <(sed -n '/^  relay.json: |-$/,$p' <<<"$dashboard" | tail -n +2 | sed 's/^    //'); then
  echo "the dashboard ConfigMap does not carry dashboards/relay.json as it is"; exit 1
fi
grep -q '^  namespace: monitoring$' <<<"$dashboard" || { echo "grafana.dashboard.namespace is not the ConfigMap's"; exit 1; }
grep -q '^    dashboards: "relay"$' <<<"$dashboard" || { echo "grafana.dashboard.labelKey/labelValue is not on the ConfigMap"; exit 1; }
# values.schema.json: lint refuses a value of the wrong kind and a key the chart does not know,
# naming the value's path.
for bad in "log.level=verbose:/log/level" "admin.port=70000:/admin/port" "registry.cacheSize=10GB:/registry/cacheSize" \
  "hub.adress=192.0.2.1:additional properties 'adress'" "podLabels.tier=1:/podLabels/tier" \
  "imagePullSecrets[0].nam=regcred:additional properties 'nam'" "extraEnv[0].name=1x:/extraEnv/0/name" \
  "topologySpreadConstraints[0].maxSkew=0:/topologySpreadConstraints/0" \
  "prometheusRule.disabled[0]=RelayDetachd:/prometheusRule/disabled/0" "prometheusRule.selector=job=\"x\"}:does not match pattern"; do
  if out=$("$helm" lint --strict . -f testdata/ci-values.yaml --set "${bad%%:*}" 2>&1); then
    echo "helm lint accepted --set ${bad%%:*}"; exit 1
  fi
  grep -q "${bad#*:}" <<<"$out" || { echo "helm lint refused --set ${bad%%:*} without naming ${bad#*:}: $out"; exit 1; }
done
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
# HA (docs/ha.md): nothing of it without ha.enabled; the key Secret is the operator's, and named
# when missing; one replica is refused; a given affinity replaces the default anti-affinity.
plain=$(render -f testdata/ci-values.yaml)
for what in "kind: Role" "kind: RoleBinding" "kind: ServiceAccount" "kind: PodDisruptionBudget" "serviceAccountName:" \
  "relay.serve.zone/role" "RollingUpdate" "POD_NAME" "replication"; do
  if grep -q "$what" <<<"$plain"; then echo "without ha.enabled the chart renders $what"; exit 1; fi
done
grep -q "automountServiceAccountToken: false" <<<"$plain" || { echo "without ha.enabled a token would be mounted"; exit 1; }
if out=$(render -f testdata/ci-values.yaml --set ha.enabled=true 2>&1); then echo "ha without a replication key Secret rendered"; exit 1; fi
grep -q "ha.replicationKeySecret.name is required" <<<"$out" || { echo "unexpected error: $out"; exit 1; }
if out=$(render -f testdata/ci-values.yaml -f testdata/ha-values.yaml --set ha.replicas=1 2>&1); then echo "ha with one replica rendered"; exit 1; fi
grep -q "ha.replicas must be at least 2" <<<"$out" || { echo "unexpected error: $out"; exit 1; }
own=$(render -f testdata/ci-values.yaml -f testdata/ha-values.yaml --set affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=relay \
  --set affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists --show-only templates/deployment.yaml)
if grep -q podAntiAffinity <<<"$own" || ! grep -q nodeAffinity <<<"$own"; then echo "a given affinity does not replace the HA default"; exit 1; fi
# extraEnv may not set a variable twice, nor podLabels the labels the Deployment, the Service and
# the HA election select on: each refused, naming it.
for bad in "extraEnv[0].name=SERVEZONE_RELAY_LOG_LEVEL:extraEnv sets SERVEZONE_RELAY_LOG_LEVEL" \
  "podLabels.app\.kubernetes\.io/instance=x:podLabels may not set app.kubernetes.io/instance" \
  "podLabels.relay\.serve\.zone/role=leader:podLabels may not set relay.serve.zone/role"; do
  if out=$(render -f testdata/ci-values.yaml --set "${bad%%:*}" 2>&1); then echo "--set ${bad%%:*} rendered"; exit 1; fi
  grep -q "${bad#*:}" <<<"$out" || { echo "--set ${bad%%:*} refused without naming it: $out"; exit 1; }
done
# helm test: its Pod and Service are hooks that only `helm test` creates, and with tests.enabled
# off neither they nor the NetworkPolicy's rule for them are rendered.
hooks=$(render -f testdata/ci-values.yaml --show-only templates/tests/readyz.yaml)
[ "$(grep -c '^    helm.sh/hook: test$' <<<"$hooks")" = 2 ] || { echo "the test's Pod and Service are not both test hooks"; exit 1; }
if out=$(render -f testdata/ci-values.yaml --set tests.enabled=false 2>&1 | grep -e relay-test -e 'helm.sh/hook'); then
  echo "tests.enabled=false still renders the test: $out"; exit 1
fi
# The PrometheusRule: its alerts select this release's series as the ServiceMonitor labels them,
# so without it they need a selector; the HA alerts come only with ha.enabled; disabled leaves
# alerts out; and promtool reads the rules and runs testdata/prometheusrule.test.yaml against them.
if out=$(render -f testdata/ci-values.yaml --set serviceMonitor.enabled=false --set prometheusRule.enabled=true 2>&1); then
  echo "a PrometheusRule without a ServiceMonitor or a selector rendered"; exit 1
fi
grep -q "prometheusRule.enabled needs serviceMonitor.enabled" <<<"$out" || { echo "unexpected error: $out"; exit 1; }
rule() { render -f testdata/ci-values.yaml --set prometheusRule.enabled=true --show-only templates/prometheusrule.yaml "$@"; }
alerts() { grep -o 'alert: [A-Za-z]*' | sed 's/alert: //' | tr '\n' ' '; }
got=$(rule | alerts)
[ "$got" = "RelayDetached RelayEscrowReleasing RelayPeerMemoryBudgetNearlyFull RelayCertificateExpiring " ] || { echo "alerts without ha: $got"; exit 1; }
got=$(rule --set serviceMonitor.enabled=false --set 'prometheusRule.selector=cluster="a"' --set 'prometheusRule.disabled={RelayDetached,RelayCertificateExpiring}' | alerts)
[ "$got" = "RelayEscrowReleasing RelayPeerMemoryBudgetNearlyFull " ] || { echo "alerts with two disabled: $got"; exit 1; }
rule --set serviceMonitor.enabled=false --set 'prometheusRule.selector=cluster="a"' | grep -q 'relay_upstream_attached{cluster="a"} == 0' \
  || { echo "prometheusRule.selector is not what the alerts select on"; exit 1; }
if command -v promtool >/dev/null 2>&1; then
  rules=$(mktemp -d)
  trap 'rm -rf "$rules"' EXIT
  sed -n '/^spec:$/,$p' testdata/prometheusrule.golden.yaml | tail -n +2 | sed 's/^  //' > "$rules/rules.yaml"
  cp testdata/prometheusrule.test.yaml "$rules/"
  promtool check rules "$rules/rules.yaml" >/dev/null || { promtool check rules "$rules/rules.yaml"; exit 1; }
  promtool test rules "$rules/prometheusrule.test.yaml" >/dev/null || { promtool test rules "$rules/prometheusrule.test.yaml"; exit 1; }
elif [ "${RELAY_REQUIRE_PROMTOOL:-}" = 1 ]; then
  echo "promtool is missing (apt-get install prometheus), and RELAY_REQUIRE_PROMTOOL=1: the alerts must be checked"; exit 1
else
  echo "promtool is missing (apt-get install prometheus): the PrometheusRule's PromQL and its unit tests were not run"
fi
echo "chart: lint and golden templates ok"
