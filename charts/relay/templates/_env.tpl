{{/*
The relay container's environment: every flag the chart sets, as SERVEZONE_RELAY_<FLAG>. Its own
template so that deployment.yaml can refuse an extraEnv entry that would set one of them twice.
*/}}
{{- define "relay.env" -}}
- name: SERVEZONE_RELAY_CLUSTER_ID
  value: {{ .Values.clusterId | quote }}
- name: SERVEZONE_RELAY_NODE_ID
  {{- if .Values.nodeId }}
  value: {{ .Values.nodeId | quote }}
  {{- else }}
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
  {{- end }}
- name: SERVEZONE_RELAY_CLOUDLY_URL
  value: {{ .Values.cloudly.url | quote }}
- name: SERVEZONE_RELAY_CLOUDLY_TOKEN_FILE
  value: /var/run/secrets/serve.zone/cloudly/{{ .Values.cloudly.tokenSecret.key }}
{{- if .Values.cloudly.caSecret.name }}
- name: SERVEZONE_RELAY_CLOUDLY_CA_FILE
  value: /var/run/secrets/serve.zone/cloudly-ca/{{ .Values.cloudly.caSecret.key }}
{{- end }}
- name: SERVEZONE_RELAY_LISTEN
  value: ":{{ .Values.downstream.port }}"
- name: SERVEZONE_RELAY_ADVERTISE_ADDRESS
  value: {{ .Values.advertiseAddress | quote }}
- name: SERVEZONE_RELAY_TLS_CERT_FILE
  value: /var/run/secrets/serve.zone/tls/tls.crt
- name: SERVEZONE_RELAY_TLS_KEY_FILE
  value: /var/run/secrets/serve.zone/tls/tls.key
{{- if and .Values.hub.enabled (not .Values.ha.enabled) }}
- name: SERVEZONE_RELAY_HUB_LISTEN
  value: "{{ .Values.hub.address }}:{{ .Values.hub.port }}"
{{- end }}
{{- if .Values.hub.enabled }}
- name: SERVEZONE_RELAY_HUB_KEY_FILE
  value: /var/run/secrets/serve.zone/hub/{{ .Values.hub.keySecret.key }}
{{- end }}
{{- if .Values.registry.upstream }}
- name: SERVEZONE_RELAY_REGISTRY_UPSTREAM
  value: {{ .Values.registry.upstream | quote }}
- name: SERVEZONE_RELAY_REGISTRY_CACHE_DIR
  value: /var/cache/relay-registry
- name: SERVEZONE_RELAY_REGISTRY_CACHE_MAX_BYTES
  value: {{ include "relay.registryCacheMaxBytes" . | quote }}
{{- if .Values.registry.caSecret.name }}
- name: SERVEZONE_RELAY_REGISTRY_CA_FILE
  value: /var/run/secrets/serve.zone/registry-ca/{{ .Values.registry.caSecret.key }}
{{- end }}
{{- end }}
{{- if .Values.corestoreCASecret.name }}
- name: SERVEZONE_RELAY_CORESTORE_CA_FILE
  value: /var/run/secrets/serve.zone/corestore-ca/{{ .Values.corestoreCASecret.key }}
{{- end }}
- name: SERVEZONE_RELAY_ADMIN_LISTEN
  value: ":{{ .Values.admin.port }}"
- name: SERVEZONE_RELAY_MAX_MESSAGE_BYTES
  value: {{ .Values.maxMessageBytes | int64 | quote }}
- name: SERVEZONE_RELAY_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: SERVEZONE_RELAY_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
{{- if .Values.ha.enabled }}
# The election (docs/ha.md): the Lease's namespace is the service account's, the
# identity the Pod's name; the Pod's address is what standbys dial for replication.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- if .Values.hub.enabled }}
# Each replica's hub binds its own Pod's address; every one reports hub.address, the
# Service's, which routes the hub's UDP port to the leader.
- name: SERVEZONE_RELAY_HUB_LISTEN
  value: "$(POD_IP):{{ .Values.hub.port }}"
- name: SERVEZONE_RELAY_HUB_ADVERTISE_ADDRESS
  value: {{ .Values.hub.address | quote }}
{{- end }}
- name: SERVEZONE_RELAY_HA_LEASE_NAME
  value: {{ include "relay.haLeaseName" . | quote }}
- name: SERVEZONE_RELAY_HA_REPLICATION_LISTEN
  value: ":{{ .Values.ha.replicationPort }}"
- name: SERVEZONE_RELAY_HA_REPLICATION_KEY_FILE
  value: /var/run/secrets/serve.zone/replication/{{ .Values.ha.replicationKeySecret.key }}
{{- end }}
{{- end -}}
