"""Prometheus series of the plugins and of the MPS control daemon: names, help, labels; nothing else.

Each process has its own registry, so the plugin never exports the daemon's series and the other way
round. Importing this module costs prometheus-client's import (about 40 ms, 5 MiB): processes import
it only when metrics are on, through `nvdp.daemon.report.recording`, where the edges record into these series.
Label values are bounded by the node (resource names, GPU UUIDs, XID codes, fixed reason words):
never pod names, container IDs, replica IDs or claim UIDs. The one exception is the usage series
(--usage-metrics), made at each scrape by nvdp.usage.series for the containers that hold a device at
that moment: a pod's series go with the pod. Their names and labels are below; their labels are
dcgm-exporter's, so its dashboards can be adapted. The DRA kubelet plugin's series are NVIDIA's
(`nvidia_dra_*`), so dashboards of NVIDIA's driver work unchanged; it shares the plugin's registry.
docs/metrics.md lists every series.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from nvdp import __version__

PLUGIN = CollectorRegistry(auto_describe=True)
MPS_DAEMON = CollectorRegistry(auto_describe=True)

# --- plugin -----------------------------------------------------------------------------------------

PLUGIN_BUILD = Info("nvdp_build", "Version of the running plugin.", registry=PLUGIN)
PLUGIN_BUILD.info({"version": __version__, "component": "device-plugin",
                   "python": platform.python_version()})

DEVICES = Gauge(
    "nvdp_devices", "Devices advertised to the kubelet, by resource and health.",
    ["resource", "health"], registry=PLUGIN,
)
RESOURCE_REGISTERED = Gauge(
    "nvdp_resource_registered", "1 while the resource is registered with the kubelet, else 0.",
    ["resource"], registry=PLUGIN,
)
REGISTRATIONS = Counter(
    "nvdp_registrations",
    "Registration attempts with the kubelet, by resource and result (success, failure).",
    ["resource", "result"], registry=PLUGIN,
)
KUBELET_RESTARTS = Counter(
    "nvdp_kubelet_restarts", "Times the kubelet socket was created again (a kubelet restart).",
    registry=PLUGIN,
)
ALLOCATIONS = Counter(
    "nvdp_allocations", "Containers given devices by Allocate, by resource.", ["resource"], registry=PLUGIN,
)
ALLOCATION_DEVICES = Histogram(
    "nvdp_allocation_devices", "Devices requested per container in Allocate, by resource.",
    ["resource"], buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=PLUGIN,
)
ALLOCATION_REFUSALS = Counter(
    "nvdp_allocation_refusals", "Allocate requests refused, by resource and reason.",
    ["resource", "reason"], registry=PLUGIN,
)
ALLOCATE_DURATION = Histogram(
    "nvdp_allocate_duration_seconds", "Time to answer one Allocate call, by resource.", ["resource"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
    registry=PLUGIN,
)
GPU_HEALTH = Gauge(
    "nvdp_gpu_unhealthy",
    "GPUs that are down, by UUID and what brings them back (recovering: by itself after the quiet period; "
    "needs-reset: a GPU reset; flapping or recovery-off: clearing by hand or a restart). 1 while down.",
    ["gpu", "state"], registry=PLUGIN,
)
HEALTH_RECOVERIES = Counter(
    "nvdp_gpu_recoveries",
    "GPUs that came back after being down, by UUID and how (recovered: by the health rules; "
    "cleared: by hand).",
    ["gpu", "how"], registry=PLUGIN,
)
XID_EVENTS = Counter(
    "nvdp_xid_events",
    "XID events seen, by GPU UUID, XID code and action (ignored, or critical: devices marked Unhealthy).",
    ["gpu", "xid", "action"], registry=PLUGIN,
)
CONFIG_RELOADS = Counter(
    "nvdp_config_reloads", "Config reloads (SIGHUP), by result (applied, refused).", ["result"],
    registry=PLUGIN,
)
CONFIG_ACTIVE = Gauge(
    "nvdp_config_active", "1 for the config in force: its source and the selected entry.",
    ["source", "entry"], registry=PLUGIN,
)
CONFIG_LAST_RELOAD = Gauge(
    "nvdp_config_last_reload_timestamp_seconds", "When the last reload was attempted, by result.",
    ["result"], registry=PLUGIN,
)
MPS_READY = Gauge(
    "nvdp_mps_daemon_ready", "1 while the MPS control daemon of an MPS-shared resource answers, else 0.",
    ["resource"], registry=PLUGIN,
)

# --- usage (--usage-metrics): made at each scrape (nvdp.usage.series), never registered as series here --
# A device, in dcgm-exporter's label names: GPU index, GPU UUID, nvidia<minor>, model, node, and for a MIG
# device its profile and GPU instance id ("" on a whole GPU).
USAGE_DEVICE_LABELS = ("gpu", "UUID", "device", "modelName", "hostname", "GPU_I_PROFILE", "GPU_I_ID")
# A container using it, in dcgm-exporter's names (its per-pod labels and its DRA labels).
USAGE_LABELS = (*USAGE_DEVICE_LABELS, "namespace", "pod", "container", "pod_uid", "dra_claim_namespace",
                "dra_claim_name", "dra_driver_name", "dra_pool_name", "dra_device_name")
POD_GPU_MEMORY = ("nvdp_pod_gpu_memory_used_bytes",
                  "GPU memory used by the container's processes on the device it holds, in bytes.")
POD_GPU_SM_UTIL = ("nvdp_pod_gpu_sm_utilization_percent",
                   "SM utilization of the container's processes on the GPU it holds, percent over the last "
                   "NVML samples (not reported for MIG devices).")
GPU_OTHER_PROCESSES = ("nvdp_gpu_unattributed_processes",
                       "Processes on a device this plugin handed out that belong to none of its holders.")
USAGE_PROBLEMS = ("nvdp_usage_collection_problems",
                  "Problems in the last usage collection (0: every figure was read); the log names them.")
USAGE_DURATION = ("nvdp_usage_collection_duration_seconds", "Time the last usage collection took.")

# --- DRA kubelet plugin: NVIDIA's names, labels and buckets (k8s-dra-driver-gpu pkg/metrics) -----------
# A "request" is one claim of a NodePrepareResources / NodeUnprepareResources call, as NVIDIA counts.

DRA_REQUESTS = Counter(
    "nvidia_dra_requests", "Total number of DRA prepare and unprepare requests.",
    ["driver", "operation"], registry=PLUGIN,
)
DRA_REQUEST_DURATION = Histogram(
    "nvidia_dra_request_duration_seconds", "Duration of DRA prepare and unprepare requests.",
    ["driver", "operation"], buckets=tuple(0.05 * 2**k for k in range(9)), registry=PLUGIN,
)
DRA_REQUESTS_IN_FLIGHT = Gauge(
    "nvidia_dra_requests_inflight", "Number of in-flight DRA prepare and unprepare requests.",
    ["driver", "operation"], registry=PLUGIN,
)
DRA_PREPARED_DEVICES = Gauge(
    "nvidia_dra_prepared_devices", "Current number of prepared devices by device type.",
    ["node", "driver", "device_type"], registry=PLUGIN,
)
DRA_PREPARE_ERRORS = Counter(
    "nvidia_dra_node_prepare_errors", "Total number of failures during DRA node prepare, by cause.",
    ["driver", "error_type"], registry=PLUGIN,
)
DRA_UNPREPARE_ERRORS = Counter(
    "nvidia_dra_node_unprepare_errors", "Total number of failures during DRA node unprepare, by cause.",
    ["driver", "error_type"], registry=PLUGIN,
)

# --- MPS control daemon -----------------------------------------------------------------------------

MPS_BUILD = Info("nvdp_build", "Version of the running MPS control daemon manager.", registry=MPS_DAEMON)
MPS_BUILD.info({"version": __version__, "component": "mps-control-daemon",
                "python": platform.python_version()})

MPS_DAEMON_READY = Gauge(
    "nvdp_mps_control_daemon_ready", "1 while the resource's MPS control daemon answers, else 0.",
    ["resource"], registry=MPS_DAEMON,
)
MPS_DAEMON_STARTS = Counter(
    "nvdp_mps_control_daemon_starts", "MPS control daemon starts, by resource and result (started, failed).",
    ["resource", "result"], registry=MPS_DAEMON,
)
MPS_DAEMON_RESTARTS = Counter(
    "nvdp_mps_control_daemon_restarts",
    "Restarts after the daemon exited, stopped answering or failed to start, by resource.",
    ["resource"], registry=MPS_DAEMON,
)
MPS_COMMANDS = Counter(
    "nvdp_mps_control_commands",
    "Commands sent to the MPS control daemon, by resource, command and result (ok, error).",
    ["resource", "command", "result"], registry=MPS_DAEMON,
)
