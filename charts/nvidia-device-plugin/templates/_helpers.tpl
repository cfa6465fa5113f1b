{{/*
Naming: the same rules as NVIDIA's chart, so object names stay what users of that chart expect
(release "k8s-device-plugin" gives DaemonSets "k8s-device-plugin-nvidia-device-plugin" and
"k8s-device-plugin-nvidia-device-plugin-mps-control-daemon").
*/}}
{{- define "nvidia-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nvidia-device-plugin.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<suffix>", kept within the 63 characters of a label value / DNS label. */}}
{{- define "nvidia-device-plugin.suffixedName" -}}
{{- $full := include "nvidia-device-plugin.fullname" .root -}}
{{- printf "%s-%s" ($full | trunc (int (sub 62 (len .suffix)))) .suffix | replace "--" "-" -}}
{{- end -}}

{{- define "nvidia-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nvidia-device-plugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "nvidia-device-plugin.serviceAccountName" -}}
{{- include "nvidia-device-plugin.suffixedName" (dict "root" . "suffix" "service-account") -}}
{{- end -}}

{{- define "nvidia-device-plugin.configMapName" -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else -}}
{{- include "nvidia-device-plugin.suffixedName" (dict "root" . "suffix" "configs") -}}
{{- end -}}
{{- end -}}

{{/* Selector labels shared by all objects of the release; each DaemonSet adds its component. */}}
{{- define "nvidia-device-plugin.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride -}}
{{- toYaml .Values.selectorLabelsOverride -}}
{{- else -}}
app.kubernetes.io/name: {{ include "nvidia-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}

{{/* Call with (dict "root" $ "component" "..."): the DaemonSet's own selector. */}}
{{- define "nvidia-device-plugin.componentSelectorLabels" -}}
{{ include "nvidia-device-plugin.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "nvidia-device-plugin.labels" -}}
helm.sh/chart: {{ include "nvidia-device-plugin.chart" . }}
{{ include "nvidia-device-plugin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with include "nvidia-device-plugin.simulatedGpusLabel" . }}{{ . | nindent 0 }}{{ end }}
{{- end -}}

{{/*
unsupported.simulatedGpus (clusters without GPUs only): the stand-in images "<repository>-sim", which
scripts/build-images.sh --stand-ins, scripts/kit_images.py --stand-ins and the end-to-end suite build
with every node profile, the environment that shows each of their containers the profile named
(simulatedGpusEnv), and a label on every object and pod that says so. Nothing of it renders when the
value is empty.
*/}}
{{- define "nvidia-device-plugin.simulatedGpusLabel" -}}
{{- with .Values.unsupported.simulatedGpus -}}
unsupported-simulated-gpus: {{ . | quote }}
{{- end -}}
{{- end -}}

{{- define "nvidia-device-plugin.standInSuffix" -}}
{{- if .Values.unsupported.simulatedGpus }}-sim{{ end -}}
{{- end -}}

{{/* Env entries for every container of a stand-in image: the profile its stand-in NVML reads and the
sysfs tree the inventory reads its GPUs' NUMA nodes from, where the stand-in images keep each profile
(scripts/kit_images.py profile_env, tests/e2e/Dockerfile.sim). A name the images lack: NVML does not
initialise and the stand-in says so in the pod's log. */}}
{{- define "nvidia-device-plugin.simulatedGpusEnv" -}}
{{- with .Values.unsupported.simulatedGpus -}}
- name: NVML_SIM_PROFILE
  value: {{ printf "/opt/nvml-sim/profiles/%s/profile.json" . | quote }}
- name: NVDP_SYSFS_ROOT
  value: {{ printf "/opt/nvml-sim/profiles/%s/sys" . | quote }}
{{- end -}}
{{- end -}}

{{- define "nvidia-device-plugin.image" -}}
{{- printf "%s%s:%s" .Values.image.repository (include "nvidia-device-plugin.standInSuffix" .) (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "nvidia-device-plugin.mpsImage" -}}
{{- printf "%s%s:%s" .Values.mpsImage.repository (include "nvidia-device-plugin.standInSuffix" .) (default .Chart.AppVersion .Values.mpsImage.tag) -}}
{{- end -}}

{{/* The helm test pod's image: tests.image, or with simulated GPUs the plugin's stand-in image, whose
nvidia-smi -L lists the simulated GPUs. */}}
{{- define "nvidia-device-plugin.testImage" -}}
{{- if .Values.unsupported.simulatedGpus -}}
{{- include "nvidia-device-plugin.image" . -}}
{{- else -}}
{{- printf "%s:%s" .Values.tests.image.repository .Values.tests.image.tag -}}
{{- end -}}
{{- end -}}

{{- define "nvidia-device-plugin.mpsImagePullPolicy" -}}
{{- default .Values.image.pullPolicy .Values.mpsImage.pullPolicy -}}
{{- end -}}

{{/*
How both MPS DaemonSets roll (mps.upgrade). whenIdle: a surge, in which the new pod waits beside the old
one and turns Ready only once no pod of its node uses MPS (nvdp.mps.node.handover), so that the DaemonSet
controller retires the old pod, and its MPS servers, only then. immediately: the chart's updateStrategy.
*/}}
{{- define "nvidia-device-plugin.mpsUpdateStrategy" -}}
{{- if eq .Values.mps.upgrade "whenIdle" }}
type: RollingUpdate
rollingUpdate:
  maxSurge: 1
  maxUnavailable: 0
{{- else if .Values.updateStrategy }}
{{- toYaml .Values.updateStrategy }}
{{- end }}
{{- end -}}

{{/* The MPS daemon of device-plugin mode asks the kubelet which pods use MPS (a surge waits for them) and
which pods use the node's GPUs (a mode switch waits for them). */}}
{{- define "nvidia-device-plugin.mpsAsksKubelet" -}}
{{- if or (eq .Values.mps.upgrade "whenIdle") (include "nvidia-device-plugin.modeSwitchAsksKubelet" .) }}true{{ end -}}
{{- end -}}

{{- define "nvidia-device-plugin.mpsReadyFile" -}}
/tmp/mps-daemon-ready
{{- end -}}

{{/* The MPS daemon container's turn on its node: its pod's name for the waiting record, and the file
its readiness probe tests (present while it runs the node's daemons, or waits on an idle node). */}}
{{- define "nvidia-device-plugin.mpsHandoverEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: MPS_READY_FILE
  value: {{ include "nvidia-device-plugin.mpsReadyFile" . | quote }}
{{- end -}}

{{- define "nvidia-device-plugin.mpsReadinessProbe" -}}
# Ready while this pod runs the node's MPS daemons, or while it waits to take over and nothing on the
# node uses MPS: during a surge (mps.upgrade whenIdle) the old pod is retired only then. Otherwise the
# probe prints which pods it waits for, which the kubelet records in the pod's Unhealthy Event.
readinessProbe:
  exec:
    command:
      - sh
      - -c
      - {{ printf "test -e %s || { cat %s.why 2>/dev/null; exit 1; }" (include "nvidia-device-plugin.mpsReadyFile" .) (include "nvidia-device-plugin.mpsReadyFile" .) | quote }}
  periodSeconds: 2
  failureThreshold: 1
{{- end -}}

{{/*
Inline config entries parsed into objects, as JSON {"entries": [...]}. String entries (from
--set-file) are parsed with fromYaml; ones that do not parse are left out here and reported by
validation.yaml.
*/}}
{{- define "nvidia-device-plugin.parsedConfigs" -}}
{{- $entries := list -}}
{{- range $key, $value := .Values.config.map -}}
{{- if kindIs "string" $value -}}
{{- $parsed := fromYaml $value -}}
{{- if not (hasKey $parsed "Error") -}}
{{- $entries = append $entries $parsed -}}
{{- end -}}
{{- else if kindIs "map" $value -}}
{{- $entries = append $entries $value -}}
{{- end -}}
{{- end -}}
{{- dict "entries" $entries | toJson -}}
{{- end -}}

{{/*
"true" when a config is given (inline entries or an existing ConfigMap). The daemons then get the
ConfigMap as a directory of entries (CONFIG_DIR), config.default (DEFAULT_CONFIG) and the fallback
strategies (FALLBACK_STRATEGIES), and each chooses its node's entry itself (nvdp/config/select.py:
the node label nvidia.com/device-plugin.config, else config.default, else the fallbacks), as NVIDIA's
config-manager does. The chart never chooses an entry.
*/}}
{{- define "nvidia-device-plugin.hasConfig" -}}
{{- if or .Values.config.name .Values.config.map -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the plugin pods get the config entries as a directory (CONFIG_DIR): whenever a config
is given.
*/}}
{{- define "nvidia-device-plugin.perNodeConfig" -}}
{{- if and .Values.devicePlugin.enabled (include "nvidia-device-plugin.hasConfig" .) -}}true{{- end -}}
{{- end -}}

{{/*
"true" when one inline entry is what every node runs, label or not: config.default names it, or the
fallback strategies reach it (`single`, or `named` for an entry called "default") before `empty`.
The daemons' rule (nvdp/config/select.py) then has nothing left for the node label to choose.
*/}}
{{- define "nvidia-device-plugin.oneEntryForEveryNode" -}}
{{- if and (not .Values.config.name) (eq (len .Values.config.map) 1) -}}
{{- $entry := first (keys .Values.config.map) -}}
{{- $result := "" -}}
{{- if .Values.config.default -}}
{{- $result = "true" -}}
{{- else -}}
{{- $decided := false -}}
{{- range $strategy := .Values.config.fallbackStrategies -}}
{{- if not $decided -}}
{{- if or (eq $strategy "single") (and (eq $strategy "named") (eq $entry "default")) -}}
{{- $decided = true -}}
{{- $result = "true" -}}
{{- else if ne $strategy "named" -}}
{{- $decided = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $result -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the node label can change a node's config entry, so the plugin pods watch their Node
(and record Events on it when the label names an unknown entry), which needs the API access granted
in rbac.yaml: several inline entries, an existing ConfigMap (config.name: entries unseen here), or
one entry that unlabelled nodes do not get (fallback `empty`). One entry every node runs anyway
needs no API access.
*/}}
{{- define "nvidia-device-plugin.nodeLabelChoosesConfig" -}}
{{- if and (include "nvidia-device-plugin.perNodeConfig" .) (not (include "nvidia-device-plugin.oneEntryForEveryNode" .)) -}}true{{- end -}}
{{- end -}}

{{/* Per-node config: the environment that tells the plugin and the MPS daemon how to choose. */}}
{{- define "nvidia-device-plugin.nodeConfigEnv" -}}
- name: CONFIG_DIR
  value: /available-configs
{{- with .Values.config.default }}
- name: DEFAULT_CONFIG
  value: {{ . | quote }}
{{- end }}
- name: FALLBACK_STRATEGIES
  value: {{ join "," .Values.config.fallbackStrategies | quote }}
{{- end -}}

{{/*
Per-node config: the whole ConfigMap as a directory (no subPath, no items), so the kubelet's volume
refresh brings ConfigMap edits to running pods, which pick them up without a restart.
*/}}
{{- define "nvidia-device-plugin.nodeConfigVolume" -}}
- name: available-configs
  configMap:
    name: {{ include "nvidia-device-plugin.configMapName" . }}
{{- end -}}

{{/*
"true" when the MPS control daemon is rendered: forced by mps.enabled, or (mps.enabled null) when
an inline config entry sets sharing.mps.
*/}}
{{- define "nvidia-device-plugin.usesMps" -}}
{{- if kindIs "bool" .Values.mps.enabled -}}
{{- if .Values.mps.enabled -}}true{{- end -}}
{{- else -}}
{{- $found := false -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $sharing := get $entry "sharing" -}}
{{- if and (kindIs "map" $sharing) (get $sharing "mps") -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* A device-list strategy value (string, comma list or list) as a list. */}}
{{- define "nvidia-device-plugin.strategyList" -}}
{{- if kindIs "string" . -}}
{{- splitList "," . | toJson -}}
{{- else if kindIs "slice" . -}}
{{- toJson . -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/*
"true" when MIG devices may be advertised (the plugin then needs SYS_ADMIN and NVML's MIG monitoring):
the migStrategy value if set (its env var overrides the config file), otherwise any inline entry whose
flags.migStrategy is set to something other than "none". An entry without flags.migStrategy runs the
plugin's default, none: a `flags:` block that only sets, say, plugin.deviceListStrategy is not MIG. An
external ConfigMap (config.name) cannot be read, so it counts as "maybe".
*/}}
{{- define "nvidia-device-plugin.migPossible" -}}
{{- if kindIs "string" .Values.migStrategy -}}
{{- if ne .Values.migStrategy "none" -}}true{{- end -}}
{{- else if .Values.config.name -}}
true
{{- else -}}
{{- $found := false -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $flags := get $entry "flags" -}}
{{- if and (kindIs "map" $flags) (hasKey $flags "migStrategy") -}}
{{- $mig := get $flags "migStrategy" -}}
{{- if and (kindIs "string" $mig) (ne $mig "") (ne $mig "none") -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when devices may be passed as volume mounts (which needs SYS_ADMIN). */}}
{{- define "nvidia-device-plugin.volumeMountsPossible" -}}
{{- $found := false -}}
{{- if or (kindIs "string" .Values.deviceListStrategy) (kindIs "slice" .Values.deviceListStrategy) -}}
{{- range (include "nvidia-device-plugin.strategyList" .Values.deviceListStrategy | fromJsonArray) -}}
{{- if eq (trim .) "volume-mounts" -}}{{- $found = true -}}{{- end -}}
{{- end -}}
{{- else if .Values.config.name -}}
{{- $found = true -}}
{{- else -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $flags := get $entry "flags" -}}
{{- if kindIs "map" $flags -}}
{{- $plugin := get $flags "plugin" -}}
{{- if kindIs "map" $plugin -}}
{{- range (include "nvidia-device-plugin.strategyList" (get $plugin "deviceListStrategy") | fromJsonArray) -}}
{{- if eq (trim .) "volume-mounts" -}}{{- $found = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the plugin may generate CDI specs (a cdi-annotations or cdi-cri strategy): decided by the
deviceListStrategy value when set (its env var overrides the config file), otherwise by the inline
entries; an external ConfigMap (config.name) cannot be read, so it counts as "maybe".
*/}}
{{- define "nvidia-device-plugin.cdiPossible" -}}
{{- $cdi := list "cdi-annotations" "cdi-cri" -}}
{{- $found := false -}}
{{- if or (kindIs "string" .Values.deviceListStrategy) (kindIs "slice" .Values.deviceListStrategy) -}}
{{- range (include "nvidia-device-plugin.strategyList" .Values.deviceListStrategy | fromJsonArray) -}}
{{- if has (trim .) $cdi -}}{{- $found = true -}}{{- end -}}
{{- end -}}
{{- else if .Values.config.name -}}
{{- $found = true -}}
{{- else -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $flags := get $entry "flags" -}}
{{- if kindIs "map" $flags -}}
{{- $plugin := get $flags "plugin" -}}
{{- if kindIs "map" $plugin -}}
{{- range (include "nvidia-device-plugin.strategyList" (get $plugin "deviceListStrategy") | fromJsonArray) -}}
{{- if has (trim .) $cdi -}}{{- $found = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}

{{/*
The host path of the CDI hook as the plugin will resolve it: cdi.nvidiaHookPath when set (its env var
overrides the config file), else the inline entries' flags.plugin.nvidiaCTKPath (NVIDIA's default
/usr/bin/nvidia-ctk for an entry without one); empty when the entries disagree, so nothing is mounted
and the plugin looks for the hook as it does without the chart.
*/}}
{{- define "nvidia-device-plugin.cdiHookPath" -}}
{{- $default := "/usr/bin/nvidia-ctk" -}}
{{- if typeIs "string" .Values.cdi.nvidiaHookPath -}}
{{- .Values.cdi.nvidiaHookPath -}}
{{- else -}}
{{- $paths := list -}}
{{- range $entry := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $path := $default -}}
{{- $flags := get $entry "flags" -}}
{{- if kindIs "map" $flags -}}
{{- $plugin := get $flags "plugin" -}}
{{- if and (kindIs "map" $plugin) (hasKey $plugin "nvidiaCTKPath") -}}
{{- if kindIs "string" (get $plugin "nvidiaCTKPath") -}}
{{- $path = get $plugin "nvidiaCTKPath" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $paths = append $paths $path | uniq -}}
{{- end -}}
{{- if not $paths -}}
{{- $default -}}
{{- else if eq (len $paths) 1 -}}
{{- first $paths -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The CDI hook's host file, mounted read-only (hostPath type File) at /host-cdi-hook/<its name>, where the
plugin checks at start that the hook exists on the host (NVDP_HOST_HOOK_DIR=/host-cdi-hook; the plugin
looks for the hook path's base name there). cdiHookPath when absolute, else empty (nothing mounted).
Only the file: the folder around it (/usr/bin for a host install) holds nothing the plugins read.
Callers decide whether CDI specs are written at all: the device plugin only with cdiPossible, the DRA
plugin always.
*/}}
{{- define "nvidia-device-plugin.cdiHookFile" -}}
{{- $path := include "nvidia-device-plugin.cdiHookPath" . -}}
{{- if and (include "nvidia-device-plugin.cdiHooksNeeded" .) (hasPrefix "/" $path) (ne (clean $path) "/") -}}
{{- clean $path -}}
{{- end -}}
{{- end -}}

{{/*
"true" unless every inline entry leaves all hooks out of its CDI specs (flags.plugin.cdiDisableHooks:
[all]), when no node needs the hook binary and none is mounted (a node without it would otherwise keep
the pod from starting). No entries, or config.name (entries unseen): needed.
*/}}
{{- define "nvidia-device-plugin.cdiHooksNeeded" -}}
{{- $entries := (include "nvidia-device-plugin.parsedConfigs" . | fromJson).entries -}}
{{- $needed := or .Values.config.name (not $entries) -}}
{{- range $entry := $entries -}}
{{- $disabled := list -}}
{{- $flags := get $entry "flags" -}}
{{- if kindIs "map" $flags -}}
{{- $plugin := get $flags "plugin" -}}
{{- if kindIs "map" $plugin -}}
{{- $disabled = include "nvidia-device-plugin.strategyList" (get $plugin "cdiDisableHooks") | fromJsonArray -}}
{{- end -}}
{{- end -}}
{{- if not (has "all" $disabled) -}}
{{- $needed = true -}}
{{- end -}}
{{- end -}}
{{- if $needed -}}true{{- end -}}
{{- end -}}

{{/*
The hook's volume mount and volume, for a container and its pod spec. Call with (dict "file" <the
cdiHookFile> "part" "mount"|"volume"); renders nothing for an empty file.
*/}}
{{- define "nvidia-device-plugin.cdiHookVolume" -}}
{{- if .file -}}
{{- if eq .part "mount" -}}
- name: cdi-hook
  mountPath: {{ printf "/host-cdi-hook/%s" (base .file) }}
  readOnly: true
{{- else -}}
# The CDI hook binary alone, read-only. A missing file keeps the pod from starting (the kubelet's event
# names the path: set cdi.nvidiaHookPath to where the hook is on the node).
- name: cdi-hook
  hostPath:
    path: {{ .file }}
    type: File
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the device plugin's container gets SYS_ADMIN: MIG may be advertised (NVML's MIG monitoring)
or devices may be passed as volume mounts.
*/}}
{{- define "nvidia-device-plugin.pluginNeedsSysAdmin" -}}
{{- if or (include "nvidia-device-plugin.migPossible" .) (include "nvidia-device-plugin.volumeMountsPossible" .) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the plugin container runs privileged: compatWithCPUManager (every device node). */}}
{{- define "nvidia-device-plugin.pluginPrivileged" -}}
{{- if and (kindIs "bool" .Values.compatWithCPUManager) .Values.compatWithCPUManager -}}true{{- end -}}
{{- end -}}

{{/*
The plugin container's security context: the user's if given; privileged for compatWithCPUManager
(needs every device node); SYS_ADMIN for MIG monitoring or volume-mounts; otherwise nothing extra.
*/}}
{{- define "nvidia-device-plugin.securityContext" -}}
{{- if .Values.securityContext -}}
{{- toYaml .Values.securityContext -}}
{{- else if include "nvidia-device-plugin.pluginPrivileged" . -}}
privileged: true
{{- else if include "nvidia-device-plugin.pluginNeedsSysAdmin" . -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
  add: ["SYS_ADMIN"]
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}
{{- end -}}

{{/* Scheduling fields shared by the DaemonSets that use the GPU (plugin, MPS daemon, GFD, DRA plugin). */}}
{{- define "nvidia-device-plugin.podScheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with include "nvidia-device-plugin.gpuAffinity" . | fromYaml }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
{{- if .Values.podSecurityContext }}
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- else }}
  seccompProfile:
    type: RuntimeDefault
{{- end }}
{{- end -}}

{{/*
The node affinity of every DaemonSet that uses the GPU: the user's `affinity`, and with
gpuOperator.respectDeployLabel only where the GPU Operator's label nvidia.com/gpu.deploy.client is
"true" or absent. The operator's mig-manager and driver-manager set it to paused-for-mig-change /
paused-for-driver-upgrade while they change a node's GPUs (and "false" disables its clients), so
those changes stop these pods and bring them back afterwards. "true or absent" takes two selector
terms (terms are ORed, a term's expressions ANDed), so each of the user's required terms is split
in two: the term and the label "true", the term and no label. Preferred terms and pod (anti-)
affinity stay as given. As YAML; "" (no affinity) when there is nothing to require.
*/}}
{{- define "nvidia-device-plugin.gpuAffinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- if .Values.gpuOperator.respectDeployLabel -}}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $key := "nvidia.com/gpu.deploy.client" -}}
{{- $deploy := list (dict "key" $key "operator" "In" "values" (list "true")) (dict "key" $key "operator" "DoesNotExist") -}}
{{- $split := list -}}
{{- range $term := $terms -}}
{{- range $expression := $deploy -}}
{{- $copy := deepCopy $term -}}
{{- $_ := set $copy "matchExpressions" (append (get $term "matchExpressions" | default list) $expression) -}}
{{- $split = append $split $copy -}}
{{- end -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $split -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- with $affinity }}{{ toYaml . }}{{ end -}}
{{- end -}}


{{/*
A container's `resources:` block: `resources` when set (every container, as in NVIDIA's chart), else
the daemon's own (devicePlugin.resources, mps.resources, gfd.resources, dra.resources, whose defaults
come from bench/RESULTS.md). Call with (dict "root" $ "own" <the daemon's value>); nothing when both
are empty.
*/}}
{{- define "nvidia-device-plugin.resources" -}}
{{- with (.root.Values.resources | default .own) -}}
resources:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
The egress rules to the API server, as a NetworkPolicy's `egress:` items:
- networkPolicy.apiServerCIDRs when set: those addresses, on networkPolicy.apiServerPorts;
- else looked up at install: the `kubernetes` Service in `default` (its cluster IPs, on its ports: where
  a pod's connection goes) and its EndpointSlice (the API servers' own addresses, on their ports: where
  it goes after the Service's address translation, which is what most network plugins check);
- else (`helm template`, a client-side --dry-run, an installing account that may not read them, no
  EndpointSlice) the ports of networkPolicy.apiServerPorts to any address, as before this lookup.
Addresses looked up are those of the install or upgrade; a control plane that moves later needs a
`helm upgrade` (or apiServerCIDRs covering where it may go).
*/}}
{{- define "nvidia-device-plugin.apiServerEgress" -}}
{{- $cidrs := .Values.networkPolicy.apiServerCIDRs | default list -}}
{{- $ports := .Values.networkPolicy.apiServerPorts -}}
{{- if $cidrs }}
- to:
    {{- range $cidrs }}
    - ipBlock:
        cidr: {{ . | quote }}
    {{- end }}
  ports:
    {{- range $ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- else }}
{{- $service := lookup "v1" "Service" "default" "kubernetes" | default dict -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict -}}
{{- $endpoints := list -}}
{{- range $endpoint := (get $slice "endpoints" | default list) -}}
{{- range $address := (get $endpoint "addresses" | default list) -}}
{{- $endpoints = append $endpoints (printf "%s/%s" $address (ternary "128" "32" (contains ":" $address))) -}}
{{- end -}}
{{- end -}}
{{- $endpointPorts := list -}}
{{- range (get $slice "ports" | default list) -}}
{{- if get . "port" -}}{{- $endpointPorts = append $endpointPorts (int (get . "port")) -}}{{- end -}}
{{- end -}}
{{- $spec := get $service "spec" | default dict -}}
{{- $serviceCidrs := list -}}
{{- range (get $spec "clusterIPs" | default (list (get $spec "clusterIP"))) -}}
{{- $ip := toString . -}}
{{- if and $ip (ne $ip "None") (ne $ip "<nil>") -}}
{{- $serviceCidrs = append $serviceCidrs (printf "%s/%s" $ip (ternary "128" "32" (contains ":" $ip))) -}}
{{- end -}}
{{- end -}}
{{- $servicePorts := list -}}
{{- range (get $spec "ports" | default list) -}}
{{- if get . "port" -}}{{- $servicePorts = append $servicePorts (int (get . "port")) -}}{{- end -}}
{{- end -}}
{{- if and $endpoints $endpointPorts }}
{{- if and $serviceCidrs $servicePorts }}
# The `kubernetes` Service's cluster IPs, found at install.
- to:
    {{- range $serviceCidrs }}
    - ipBlock:
        cidr: {{ . | quote }}
    {{- end }}
  ports:
    {{- range $servicePorts }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}
# The API servers' own addresses (the `kubernetes` EndpointSlice), found at install.
- to:
    {{- range ($endpoints | uniq) }}
    - ipBlock:
        cidr: {{ . | quote }}
    {{- end }}
  ports:
    {{- range ($endpointPorts | uniq) }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- else }}
# The API server's addresses were not known at render time (helm template, or no access to the
# `kubernetes` Service's EndpointSlice): its ports, to any address. Set networkPolicy.apiServerCIDRs
# to narrow this.
- ports:
    {{- range $ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}
{{- end }}
{{- end -}}
