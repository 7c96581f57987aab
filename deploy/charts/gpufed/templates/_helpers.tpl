{{/* Names are fixed: gpufed's code finds its identities and objects by them (one release per cluster). */}}

{{- define "gpufed.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpufed.labels" -}}
app.kubernetes.io/name: gpufed
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
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

{{- define "gpufed.checks" -}}
{{- if ne .Release.Namespace "gpufed" }}
{{- fail (printf "gpufed must be installed into the namespace gpufed (got %q): helm install gpufed deploy/charts/gpufed -n gpufed --create-namespace" .Release.Namespace) }}
{{- end }}
{{- if and .Values.estimator.enabled (not .Values.estimator.address) }}
{{- fail "estimator.address is required when estimator.enabled: the host:port consumers in other clusters reach the estimator on (e.g. the LoadBalancer's DNS name and estimator.port)" }}
{{- end }}
{{- if not (has .Values.virtualKubelet.capacity (list "live" "static")) }}
{{- fail (printf "virtualKubelet.capacity must be live or static (got %q)" .Values.virtualKubelet.capacity) }}
{{- end }}
{{- if not (has .Values.virtualKubelet.gpuPools (list "per-product" "provider")) }}
{{- fail (printf "virtualKubelet.gpuPools must be per-product or provider (got %q)" .Values.virtualKubelet.gpuPools) }}
{{- end }}
{{- if not (has .Values.gateway.wireguard.implementation (list "kernel" "userspace")) }}
{{- fail (printf "gateway.wireguard.implementation must be kernel or userspace (got %q)" .Values.gateway.wireguard.implementation) }}
{{- end }}
{{- if not (has .Values.logLevel (list "debug" "info" "warning" "error")) }}
{{- fail (printf "logLevel must be debug, info, warning or error (got %q)" .Values.logLevel) }}
{{- end }}
{{- end }}
