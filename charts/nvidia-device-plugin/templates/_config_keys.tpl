{{/*
Generated from config-schema.json by `python -m tests.chart.chart_schema_sync`; do not edit.
Known keys of each object in the plugin's config file, for validation.yaml.
*/}}
{{- define "nvidia-device-plugin.configKeys" -}}
{"": ["flags", "imex", "resources", "sharing", "version"], "flags": ["deviceDiscoveryStrategy", "failOnInitError", "gdrcopyEnabled", "gdsEnabled", "gfd", "migStrategy", "mofedEnabled", "mpsRoot", "nvidiaDevRoot", "nvidiaDriverRoot", "plugin", "useNodeFeatureAPI"], "flags.gfd": ["machineTypeFile", "noTimestamp", "oneshot", "outputFile", "sleepInterval"], "flags.plugin": ["cdiAnnotationPrefix", "containerDriverRoot", "deviceIDStrategy", "deviceListStrategy", "devicePluginPath", "disableHealthChecks", "enableHealthChecks", "kubeletSocket", "nvidiaCTKPath", "passDeviceSpecs", "sharedDevicesAllocationPolicy"], "imex": ["channelIDs", "required"], "resources": ["gpus", "mig"], "resources.gpus[]": ["name", "pattern"], "resources.mig[]": ["name", "pattern"], "sharing": ["mps", "timeSlicing"], "sharing.mps": ["failRequestsGreaterThanOne", "renameByDefault", "resources"], "sharing.mps.resources[]": ["devices", "name", "rename", "replicas"], "sharing.timeSlicing": ["failRequestsGreaterThanOne", "renameByDefault", "resources"], "sharing.timeSlicing.resources[]": ["devices", "name", "rename", "replicas"]}
{{- end -}}
