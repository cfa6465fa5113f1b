{{/* The DRA kubelet plugin: names shared by its templates. */}}
{{- define "nvidia-device-plugin.draName" -}}
{{- include "nvidia-device-plugin.suffixedName" (dict "root" . "suffix" "dra-plugin") -}}
{{- end -}}

{{/* The DaemonSet that runs the MPS control daemons of DRA claims (dra.mps), from the MPS image. */}}
{{- define "nvidia-device-plugin.draMpsName" -}}
{{- include "nvidia-device-plugin.suffixedName" (dict "root" . "suffix" "dra-mps") -}}
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

{{/* The CEL every class of full GPUs starts from: this driver's devices of type gpu. */}}
{{- define "nvidia-device-plugin.draGpuSelector" -}}
{{- printf "device.driver == '%s' && device.attributes['%s'].type == 'gpu'" .Values.dra.driverName .Values.dra.driverName -}}
{{- end -}}

{{/*
The DeviceClass of an extended resource name (dra.extendedResourceNames): the name with "/" replaced
by "-", so nvidia.com/gpu gives nvidia.com-gpu. Called with the name.
*/}}
{{- define "nvidia-device-plugin.draExtendedClassName" -}}
{{- replace "/" "-" (toString .) -}}
{{- end -}}

{{/* Whether a string is a DNS subdomain of at most 253 characters (object names, resource domains). */}}
{{- define "nvidia-device-plugin.isDnsSubdomain" -}}
{{- $value := toString . -}}
{{- if and (le (len $value) 253) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $value) -}}true{{- end -}}
{{- end -}}

{{/*
Why a string is not an extended resource name, as the API server judges one (a DeviceClass's
spec.extendedResourceName, a container's resources): empty when it is one. It must be <domain>/<name>
outside kubernetes.io, not start with "requests.", and "requests.<name>" must be a qualified name
(what quota makes of it): a DNS subdomain of at most 244 characters, then a name of at most 63.
*/}}
{{- define "nvidia-device-plugin.extendedResourceNameProblem" -}}
{{- $value := toString . -}}
{{- $parts := splitList "/" $value -}}
{{- if ne (len $parts) 2 -}}
it must be <domain>/<name>, with exactly one '/'
{{- else if contains "kubernetes.io/" $value -}}
the kubernetes.io domains are Kubernetes' own
{{- else if hasPrefix "requests." $value -}}
names starting with 'requests.' are taken by resource quotas
{{- else if or (gt (len (first $parts)) 244) (not (include "nvidia-device-plugin.isDnsSubdomain" (first $parts))) -}}
its domain must be a lower-case DNS subdomain of at most 244 characters
{{- else if or (gt (len (last $parts)) 63) (not (regexMatch "^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$" (last $parts))) -}}
the part after '/' must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit
{{- end -}}
{{- end -}}

{{/* The DRA plugin's MPS folder on the node: its daemons' state and the tmpfs their clients share. */}}
{{- define "nvidia-device-plugin.draMpsDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.mps.root) .Values.dra.driverName -}}
{{- end }}

{{/*
"true" when a node may run the DRA plugin with flags.migStrategy dynamic: an inline config entry that
sets it, or an existing ConfigMap (config.name), whose entries the chart cannot read and so counts as
"maybe" (the scheduler's cost warning in NOTES.txt).
*/}}
{{- define "nvidia-device-plugin.draDynamicMigPossible" -}}
{{- if .Values.dra.enabled -}}
{{- if .Values.config.name -}}
true
{{- else -}}
{{- $found := false -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $flags := get $entry "flags" -}}
{{- if and (kindIs "map" $flags) (eq (toString (get $flags "migStrategy")) "dynamic") -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
