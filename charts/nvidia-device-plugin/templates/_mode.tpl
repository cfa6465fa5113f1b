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
RBAC rule of the mode switch: the DRA plugin's slices for the node (the device plugin waits for them
to go before it advertises). Which pods use the GPUs (a switch waits for them) comes from the
kubelet's pod-resources socket, not the API server: no pods list, no claim reads.
*/}}
{{- define "nvidia-device-plugin.modeRules" -}}
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceslices"]
  verbs: ["list"]
{{- end -}}

{{/*
"true" when a running daemon beside the DRA plugin may switch its node's mode: the node label chooses
between config entries. It then asks the kubelet's pod-resources API which pods use the GPUs
(nvdp.daemon.podresources), through the socket mounted read-only (podResourcesEnv, -Mount, -Volume).
*/}}
{{- define "nvidia-device-plugin.modeSwitchAsksKubelet" -}}
{{- if and .Values.dra.enabled (include "nvidia-device-plugin.nodeLabelChoosesConfig" .) -}}true{{- end -}}
{{- end -}}

{{/* The kubelet's pod-resources folder on the host: beside its plugins folder (dra.kubeletPluginsDir). */}}
{{- define "nvidia-device-plugin.podResourcesDir" -}}
{{- printf "%s/pod-resources" (dir (trimSuffix "/" .Values.dra.kubeletPluginsDir)) -}}
{{- end -}}

{{- define "nvidia-device-plugin.podResourcesEnv" -}}
- name: KUBELET_POD_RESOURCES_SOCKET
  value: {{ printf "%s/kubelet.sock" (include "nvidia-device-plugin.podResourcesDir" .) | quote }}
{{- end -}}

{{- define "nvidia-device-plugin.podResourcesMount" -}}
# The kubelet's pod-resources API: which pods use this node's GPUs (a mode switch, and an MPS daemon upgrade, wait for them).
- name: pod-resources
  mountPath: {{ include "nvidia-device-plugin.podResourcesDir" . }}
  readOnly: true
{{- end -}}

{{- define "nvidia-device-plugin.podResourcesVolume" -}}
- name: pod-resources
  hostPath:
    path: {{ include "nvidia-device-plugin.podResourcesDir" . }}
    type: DirectoryOrCreate
{{- end -}}
