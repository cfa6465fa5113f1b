{{/* GPU feature discovery and the presence check: names shared by their templates. */}}
{{- define "nvidia-device-plugin.gfdName" -}}
{{- include "nvidia-device-plugin.suffixedName" (dict "root" . "suffix" "gpu-feature-discovery") -}}
{{- end -}}

{{- define "nvidia-device-plugin.gfdServiceAccountName" -}}
{{- include "nvidia-device-plugin.gfdName" . -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: two releases may share a release name. */}}
{{- define "nvidia-device-plugin.gfdClusterName" -}}
{{- $base := printf "%s-%s" (include "nvidia-device-plugin.fullname" .) (include "nvidia-device-plugin.namespace" .) -}}
{{- printf "%s-node-labeller" ($base | trunc 49 | trimSuffix "-") -}}
{{- end -}}

{{/* Either labeller runs: the service account, its role and the admission policy are needed. */}}
{{- define "nvidia-device-plugin.labellerEnabled" -}}
{{- if or .Values.gfd.enabled .Values.gfd.detectNodes -}}true{{- end -}}
{{- end -}}

{{/* ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from Kubernetes 1.30. */}}
{{- define "nvidia-device-plugin.admissionPolicySupported" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- end -}}

{{- define "nvidia-device-plugin.gfdSecurityContext" -}}
{{- if .Values.gfd.securityContext -}}
{{- toYaml .Values.gfd.securityContext -}}
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}
{{- end -}}

{{/*
"true" when GPU feature discovery talks to the API server (its token is mounted, its egress opened):
it labels the Node or writes a NodeFeature object, or it follows the node label between config
entries. Only NFD's features.d file (gfd.useNodeFeatureAPI false) without a config needs none of it.
*/}}
{{- define "nvidia-device-plugin.gfdReadsApi" -}}
{{- $toFile := and (kindIs "bool" .Values.gfd.useNodeFeatureAPI) (not .Values.gfd.useNodeFeatureAPI) -}}
{{- if and .Values.gfd.enabled (or (not $toFile) (include "nvidia-device-plugin.hasConfig" .)) -}}true{{- end -}}
{{- end -}}
