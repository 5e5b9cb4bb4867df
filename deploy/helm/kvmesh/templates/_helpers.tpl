{{- define "kvmesh.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvmesh.labels" -}}
{{ include "kvmesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secrets the pods mount: an existing one, or the chart's. */}}
{{- define "kvmesh.gossipSecret" -}}
{{- .Values.gossip.existingSecret | default (printf "%s-gossip" (include "kvmesh.fullname" .)) -}}
{{- end -}}
{{- define "kvmesh.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "kvmesh.fullname" .)) -}}
{{- end -}}
{{/* Shared memory for workers on the node's host: per-host mode only. */}}
{{- define "kvmesh.shm" -}}
{{- if .Values.shm.enabled -}}
{{- if ne .Values.kind "DaemonSet" -}}
{{- fail "shm.enabled needs kind: DaemonSet (one node per host, beside the workers that map its memory)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}
{{- define "kvmesh.hasGossip" -}}
{{- if or .Values.gossip.existingSecret .Values.gossip.key }}true{{ end -}}
{{- end -}}
{{- define "kvmesh.hasAuth" -}}
{{- if or .Values.auth.existingSecret .Values.auth.tokens }}true{{ end -}}
{{- end -}}
