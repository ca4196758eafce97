{{/* Labels every object of the release carries. */}}
{{- define "agentflows.labels" -}}
app.kubernetes.io/name: agentflows
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Selector labels of one component: pass (dict "root" $ "component" "operator"). */}}
{{- define "agentflows.selector" -}}
app.kubernetes.io/name: agentflows
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "agentflows.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The rules of one RBAC file of config/ (symlinked under files/), so the chart and the kustomize
install grant the same: pass (dict "root" $ "path" "files/rbac/role.yaml" "kind" "ClusterRole").
A file may hold several documents; the one of that kind is used.
*/}}
{{- define "agentflows.rulesOf" -}}
{{- $found := dict }}
{{- range (regexSplit "(?m)^---\\s*$" (.root.Files.Get .path) -1) }}
{{- $doc := fromYaml . }}
{{- if eq ($doc.kind | default "") $.kind }}
{{- $_ := set $found "rules" $doc.rules }}
{{- end }}
{{- end }}
{{- required (printf "no %s with rules in %s" .kind .path) $found.rules | toYaml }}
{{- end }}

{{/* The restricted Pod Security Standard for a pod and its container. */}}
{{- define "agentflows.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "agentflows.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* nodeSelector, tolerations, affinity and pull secrets of a pod: pass (dict "root" $ "v" .Values.x). */}}
{{- define "agentflows.scheduling" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- /* The OTEL_* env of the operator and the webhook receiver (README "Traces"). */}}
{{- define "agentflows.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: http/protobuf
- name: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
  value: {{ .captureMessageContent | quote }}
{{- range $name, $value := .env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
