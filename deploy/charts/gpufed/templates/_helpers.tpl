{{/* Names are fixed: gpufed's code finds its identities and objects by them (one release per cluster). */}}

{{- define "gpufed.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels of every gpufed object, also of the per-peering workloads the controller makes from
the workload templates (which it marks managed-by gpufed itself). */}}
{{- define "gpufed.labels" -}}
app.kubernetes.io/name: gpufed
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Labels of the objects this release owns (Helm creates, upgrades and deletes them). */}}
{{- define "gpufed.helmLabels" -}}
{{ include "gpufed.labels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Whether a part runs: its `enabled` value when set (true or false), else what `role` says.
consumer: the offloading webhook and the virtual kubelets; provider: the capacity estimator and the
GPU node agent; both: all four. Called with (list $ "webhook"); renders "true" or nothing.
*/}}
{{- define "gpufed.on" -}}
{{- $root := index . 0 }}
{{- $part := index . 1 }}
{{- $explicit := index $root.Values $part "enabled" }}
{{- if kindIs "bool" $explicit }}
{{- if $explicit }}true{{ end }}
{{- else }}
{{- $consumer := has $part (list "webhook" "virtualKubelet") }}
{{- $role := $root.Values.role }}
{{- if or (eq $role "both") (and (eq $role "consumer") $consumer) (and (eq $role "provider") (not $consumer)) }}true{{ end }}
{{- end }}
{{- end }}

{{/* host:port consumers reach the estimator on: estimator.address, else the Service's name in this
cluster (enough only for consumers that share this cluster's network and DNS). */}}
{{- define "gpufed.estimatorAddress" -}}
{{- .Values.estimator.address | default (printf "gpufed-estimator.%s.svc:%d" .Release.Namespace (int .Values.estimator.port)) }}
{{- end }}

{{/* Pod security every gpufed container shares: non-root, read-only root, nothing added. */}}
{{- define "gpufed.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "gpufed.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end }}

{{/* What values.schema.json cannot say. */}}
{{- define "gpufed.checks" -}}
{{- if ne .Release.Namespace "gpufed" }}
{{- fail (printf "gpufed must be installed into the namespace gpufed (got %q): helm install gpufed deploy/charts/gpufed -n gpufed --create-namespace" .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* A node selector as kubectl writes one: key=value,key=value. */}}
{{- define "gpufed.selectorText" -}}
{{- $pairs := list }}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%s" $k $v) }}{{ end }}
{{- join "," $pairs }}
{{- end }}
