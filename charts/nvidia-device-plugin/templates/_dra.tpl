{{/* The DRA kubelet plugin: names shared by its templates. */}}
{{- define "nvidia-device-plugin.draName" -}}
{{- include "nvidia-device-plugin.suffixedName" (dict "root" . "suffix" "dra-plugin") -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: two releases may share a release name. */}}
{{- define "nvidia-device-plugin.draClusterName" -}}
{{- $base := printf "%s-%s" (include "nvidia-device-plugin.fullname" .) (include "nvidia-device-plugin.namespace" .) -}}
{{- printf "%s-dra-plugin" ($base | trunc 52 | trimSuffix "-") -}}
{{- end -}}

{{/*
The DeviceClasses' domain: the driver name without a leading "gpu." label, so the default driver
gpu.nvidia.com gives the classes gpu.nvidia.com and mig.nvidia.com (NVIDIA's names).
*/}}
{{- define "nvidia-device-plugin.draClassDomain" -}}
{{- trimPrefix "gpu." .Values.dra.driverName -}}
{{- end -}}

{{/* The plugin's own folder under the kubelet's plugins folder: its socket and checkpoint. */}}
{{- define "nvidia-device-plugin.draPluginDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.dra.kubeletPluginsDir) .Values.dra.driverName -}}
{{- end -}}

{{/*
The CDI hook's host directory for the DRA plugin, which always writes CDI specs (one per claim):
that of cdi.nvidiaHookPath or the inline entries' nvidiaCTKPath, when absolute; else empty.
*/}}
{{- define "nvidia-device-plugin.draHookDir" -}}
{{- $path := include "nvidia-device-plugin.cdiHookPath" . -}}
{{- if and (hasPrefix "/" $path) (ne (dir $path) "/") -}}
{{- dir $path -}}
{{- end -}}
{{- end -}}
