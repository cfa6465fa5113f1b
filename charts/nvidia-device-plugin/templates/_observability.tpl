{{/*
Metrics and probes. Everything here renders nothing while metrics.enabled and probes.enabled are
false, so the DaemonSets stay as they were without them.
*/}}

{{/*
"true" when both plugins serve the usage series (metrics.usage.enabled, with metrics.enabled): they
then run in the host's PID namespace, to find the pod of each process on a GPU from its cgroup.
*/}}
{{- define "nvidia-device-plugin.usageMetrics" -}}
{{- if and .Values.metrics.enabled .Values.metrics.usage.enabled -}}true{{- end -}}
{{- end -}}

{{/* The plugin container's environment: where it serves /metrics and the probes. */}}
{{- define "nvidia-device-plugin.observability.pluginEnv" -}}
{{- if .Values.metrics.enabled }}
- name: METRICS_ADDRESS
  value: {{ printf ":%v" .Values.metrics.port | quote }}
{{- end }}
{{- if include "nvidia-device-plugin.usageMetrics" . }}
- name: USAGE_METRICS
  value: "true"
{{- end }}
{{- if .Values.probes.enabled }}
- name: HEALTH_ADDRESS
  value: {{ printf ":%v" .Values.probes.port | quote }}
{{- end }}
{{- end -}}

{{/* The plugin container's ports and probes (HTTP GETs answered by the plugin process itself). */}}
{{- define "nvidia-device-plugin.observability.pluginPortsAndProbes" -}}
{{- if or .Values.metrics.enabled .Values.probes.enabled }}
ports:
  {{- if .Values.metrics.enabled }}
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
    protocol: TCP
  {{- end }}
  {{- if .Values.probes.enabled }}
  - name: health
    containerPort: {{ .Values.probes.port }}
    protocol: TCP
  {{- end }}
{{- end }}
{{- if .Values.probes.enabled }}
livenessProbe:
  httpGet:
    path: /healthz
    port: health
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: health
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "nvidia-device-plugin.observability.mpsEnv" -}}
{{- if .Values.metrics.enabled }}
- name: METRICS_ADDRESS
  value: {{ printf ":%v" .Values.metrics.mpsPort | quote }}
{{- end }}
{{- end -}}

{{- define "nvidia-device-plugin.observability.mpsPorts" -}}
{{- if .Values.metrics.enabled }}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.mpsPort }}
    protocol: TCP
{{- end }}
{{- end -}}
