{{- define "relay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "relay.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "relay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* A privileged port needs NET_BIND_SERVICE, and nothing else ever does. */}}
{{- define "relay.needsBind" -}}
{{- if or (lt (int .Values.downstream.port) 1024) (lt (int .Values.admin.port) 1024) (and .Values.hub.enabled (lt (int .Values.hub.port) 1024)) -}}
true
{{- end -}}
{{- end -}}

{{/*
The registry cache's bound in bytes: 90% of registry.cacheSize, the emptyDir's sizeLimit, so that
the relay evicts before the kubelet evicts the pod for exceeding it (the bound counts object bytes,
not the filesystem's blocks and directories).
*/}}
{{- define "relay.registryCacheMaxBytes" -}}
{{- $size := toString .Values.registry.cacheSize -}}
{{- $digits := regexFind "^[0-9]+" $size -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $unit := trimPrefix $digits $size -}}
{{- if or (not $digits) (not (hasKey $units $unit)) -}}
{{- fail (printf "registry.cacheSize %q must be a whole number of Ki, Mi, Gi or Ti" $size) -}}
{{- end -}}
{{- div (mul (int64 $digits) (get $units $unit) 9) 10 -}}
{{- end -}}

{{/* HA (docs/ha.md): the Lease the replicas compete for. */}}
{{- define "relay.haLeaseName" -}}
{{- .Values.ha.leaseName | default (include "relay.fullname" .) -}}
{{- end -}}

{{/* HA: the ServiceAccount the replicas run as, bound to the Role for the Lease and their Pods. */}}
{{- define "relay.serviceAccountName" -}}
{{- include "relay.fullname" . -}}
{{- end -}}

{{/*
helm test's Pod (templates/tests/): labelled apart from the relay's selector, so that neither the
Deployment, the Service nor the PodDisruptionBudget counts it; the NetworkPolicy admits it to the
admin port by these labels.
*/}}
{{- define "relay.testSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end -}}
