{{/*
Health recovery (devicePlugin.healthRecovery): how a GPU marked Unhealthy by a critical XID comes back.
The health authority (the device plugin, or the DRA plugin on a node in DRA mode) gets the three
settings and writes <stateDir>/health.json; gpu-feature-discovery reads that file for its labels.
validation.yaml checks `after` and `flapLimit`; values.schema.json the types and `stateDir`.
*/}}

{{/* The host directory of health.json, without a trailing "/"; empty: no file, no volume. */}}
{{- define "nvidia-device-plugin.healthStateDir" -}}
{{- $dir := toString ((.Values.devicePlugin.healthRecovery | default dict).stateDir | default "") -}}
{{- if $dir -}}{{- ternary "/" (trimSuffix "/" $dir) (eq $dir "/") -}}{{- end -}}
{{- end -}}

{{/* The settings of the health authority (device plugin, DRA plugin), as environment variables; a
value set to null leaves the plugin's default (5m, 3, no file). */}}
{{- define "nvidia-device-plugin.healthEnv" -}}
{{- $health := .Values.devicePlugin.healthRecovery | default dict -}}
{{- $stateDir := include "nvidia-device-plugin.healthStateDir" . -}}
{{- if not (kindIs "invalid" $health.after) }}
- name: HEALTH_RECOVERY_AFTER
  value: {{ $health.after | quote }}
{{- end }}
{{- if not (kindIs "invalid" $health.flapLimit) }}
- name: HEALTH_FLAP_LIMIT
  value: {{ $health.flapLimit | int64 | quote }}
{{- end }}
{{- if $stateDir }}
- name: HEALTH_STATE_DIR
  value: {{ $stateDir | quote }}
{{- end }}
{{- end -}}

{{/* The health.json directory, mounted at its host path: writable for the health authority,
read-only for GFD. Call with (dict "root" . "readOnly" <bool>) where healthStateDir is not empty. */}}
{{- define "nvidia-device-plugin.healthStateMount" -}}
- name: health-state
  mountPath: {{ include "nvidia-device-plugin.healthStateDir" .root }}
  {{- if .readOnly }}
  readOnly: true
  {{- end }}
{{- end -}}

{{/* Its volume; DirectoryOrCreate, so a node's first pod finds it whichever DaemonSet starts first. */}}
{{- define "nvidia-device-plugin.healthStateVolume" -}}
- name: health-state
  hostPath:
    path: {{ include "nvidia-device-plugin.healthStateDir" . }}
    type: DirectoryOrCreate
{{- end -}}
