{{/*
The per-node mode (nvdp.daemon.pernode.mode, docs/dra.md "Per-node mode"): with dra.enabled each node is served by
the device plugin or the DRA plugin, as its config entry's flags.mode says (else dra.defaultMode).
Both DaemonSets then run on the GPU nodes, each advertising only in its own mode.
*/}}

{{/*
"true" when a config entry could put a node in device-plugin mode beside the DRA plugin: an inline
entry with flags.mode device-plugin, an existing ConfigMap (config.name: its entries are not seen
here), or dra.defaultMode device-plugin.
*/}}
{{- define "nvidia-device-plugin.devicePluginModePossible" -}}
{{- $found := or .Values.config.name (eq (toString .Values.dra.defaultMode) "device-plugin") -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $flags := get $entry "flags" -}}
{{- if and (kindIs "map" $flags) (eq (toString (get $flags "mode")) "device-plugin") -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}

{{/* "true" when the device-plugin DaemonSet is installed: alone, or beside the DRA plugin. */}}
{{- define "nvidia-device-plugin.devicePluginDeployed" -}}
{{- if .Values.devicePlugin.enabled -}}
{{- if or (not .Values.dra.enabled) (include "nvidia-device-plugin.devicePluginModePossible" .) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the device plugin's account reads the API server: a node label that chooses between
config entries (its Node), or beside the DRA plugin (the DRA plugin's slices for its node, the pods
using its GPUs).
*/}}
{{- define "nvidia-device-plugin.pluginReadsApi" -}}
{{- if or (include "nvidia-device-plugin.nodeLabelChoosesConfig" .) (and .Values.dra.enabled (include "nvidia-device-plugin.devicePluginDeployed" .)) -}}true{{- end -}}
{{- end -}}

{{/* The mode's environment, for every daemon beside a DRA plugin (the DRA plugin sets its own). */}}
{{- define "nvidia-device-plugin.modeEnv" -}}
{{- if .Values.dra.enabled }}
- name: NVDP_DEFAULT_MODE
  value: {{ .Values.dra.defaultMode | quote }}
- name: DRA_DRIVER_NAME
  value: {{ .Values.dra.driverName | quote }}
{{- end }}
{{- end -}}

{{/*
RBAC rules of the mode switch: the pods bound to the node and their ResourceClaims (a switch waits
while pods use the GPUs), and the DRA plugin's slices for the node (the device plugin waits for them
to go before it advertises).
*/}}
{{- define "nvidia-device-plugin.modeRules" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims"]
  verbs: ["get"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceslices"]
  verbs: ["list"]
{{- end -}}
