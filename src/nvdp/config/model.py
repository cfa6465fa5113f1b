"""Typed configuration: the one place where every default is written down.

Field names are the snake_case form of the config file's camelCase keys
(`flags.plugin.deviceListStrategy` -> `Flags.plugin.device_list_strategy`).
A test keeps this module and config-schema.json in step.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

MigStrategy = Literal["none", "single", "mixed", "dynamic"]
DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
DeviceIdStrategy = Literal["uuid", "index"]
AllocationPolicy = Literal["distributed", "packed"]
DiscoveryStrategy = Literal["auto", "nvml", "tegra"]
SharingStrategy = Literal["none", "time-slicing", "mps"]
# Which API serves a node's GPUs (nvdp.daemon.pernode.mode): the kubelet's device-plugin API or DRA
# ResourceSlices.
Mode = Literal["device-plugin", "dra"]
HealthTaintEffect = Literal["NoSchedule", "NoExecute"]
CdiHookName = Literal[
    "create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification",
    "update-application-profile", "chmod", "all",
]
# The CDI feature flags NVIDIA's plugin acts on; others are passed through (and ignored) as NVIDIA does.
KNOWN_CDI_FEATURE_FLAGS = (
    "no-additional-gids-for-device-nodes", "disable-ipc-discoverer", "enable-explicit-driver-libraries",
)

DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
RESOURCE_PREFIX = "nvidia.com/"
# NVIDIA's defaults (XID catalogue: application errors, not hardware faults).
DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)


# The device list strategies that hand out CDI names: with any of them the plugin writes CDI specs.
CDI_STRATEGIES: frozenset[DeviceListStrategy] = frozenset({"cdi-annotations", "cdi-cri"})


class PluginFlags(Struct, frozen=True):
    pass_device_specs: bool = False
    device_list_strategy: tuple[DeviceListStrategy, ...] = ("envvar",)
    device_id_strategy: DeviceIdStrategy = "uuid"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    nvidia_ctk_path: str = "/usr/bin/nvidia-ctk"
    # NVIDIA's flags without a config key there (--cdi-feature-flags, --cdi-disable-hooks); ours too.
    cdi_feature_flags: tuple[str, ...] = ()
    cdi_disable_hooks: tuple[CdiHookName, ...] = ()
    container_driver_root: str = "/driver-root"
    shared_devices_allocation_policy: AllocationPolicy = "distributed"
    # Ours: kubelet root dirs differ (k3s, microk8s), so both paths are settings.
    device_plugin_path: str = DEFAULT_DEVICE_PLUGIN_DIR
    # Empty means "<device_plugin_path>/kubelet.sock".
    kubelet_socket: str = ""
    # Same syntax as DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS: "all", "xids" or XID numbers.
    disable_health_checks: tuple[str, ...] = ()
    enable_health_checks: tuple[str, ...] = ()
    # Ours: how a GPU marked Unhealthy comes back. "never" (NVIDIA's behaviour) or a Go duration > 0;
    # nvdp.config.durations.recovery_after_seconds gives the seconds.
    health_recovery_after: str = "5m"
    # More Unhealthy turns than this within an hour: the GPU stays down (flapping).
    health_flap_limit: int = 3
    # Host directory of health.json (written by the health authority, read by GFD); empty: no file.
    health_state_dir: str = ""
    # DRA mode: the effect of a down GPU's device taints (nvdp.dra.pool.taints); NoExecute evicts its pods.
    health_taint_effect: HealthTaintEffect = "NoSchedule"

    @property
    def cdi_strategies(self) -> tuple[DeviceListStrategy, ...]:
        """The CDI strategies in use, in the config's order; empty when CDI is off."""
        return tuple(s for s in self.device_list_strategy if s in CDI_STRATEGIES)

    @property
    def kubelet_socket_path(self) -> str:
        return self.kubelet_socket or f"{self.device_plugin_path.rstrip('/')}/kubelet.sock"


class GfdFlags(Struct, frozen=True):
    """gpu-feature-discovery's settings (NVIDIA's names); the plugin does not act on them."""

    oneshot: bool = False
    no_timestamp: bool = False
    sleep_interval: str = "60s"
    output_file: str = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    machine_type_file: str = "/sys/class/dmi/id/product_name"


class Flags(Struct, frozen=True):
    mig_strategy: MigStrategy = "none"
    # migStrategy dynamic: the MIG profiles ("1g.10gb") or single placements ("3g.40gb@4") a node
    # publishes; None: every profile NVML reports (nvdp.dra.pool.partitions.Offers).
    mig_dynamic_profiles: tuple[str, ...] | None = None
    fail_on_init_error: bool = True
    # NVIDIA's binary defaults to "" but its chart always sets this; MPS cannot work without one.
    mps_root: str = "/run/nvidia/mps"
    nvidia_driver_root: str = "/"
    # Empty means "same as nvidia_driver_root", as NVIDIA resolves it.
    nvidia_dev_root: str = ""
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    use_node_feature_api: bool | None = None
    device_discovery_strategy: DiscoveryStrategy = "auto"
    # None: the deployment's default (env NVDP_DEFAULT_MODE, else device-plugin;
    # nvdp.daemon.pernode.mode.node_mode).
    mode: Mode | None = None
    plugin: PluginFlags = field(default_factory=PluginFlags)
    gfd: GfdFlags = field(default_factory=GfdFlags)

    @property
    def dev_root(self) -> str:
        return self.nvidia_dev_root or self.nvidia_driver_root


class ResourcePattern(Struct, frozen=True):
    pattern: str
    name: str  # fully qualified, e.g. "nvidia.com/gpu"


class Resources(Struct, frozen=True):
    """Empty lists mean NVIDIA's defaults, which depend on the MIG strategy (see plan)."""

    gpus: tuple[ResourcePattern, ...] = ()
    mig: tuple[ResourcePattern, ...] = ()


class DeviceSelection(Struct, frozen=True):
    """`devices:` of a shared resource: all, the first `count`, or explicit references.

    A reference is a GPU index ("0"), a MIG index ("0:1"), a GPU UUID ("GPU-...")
    or a MIG UUID ("MIG-..." / "MIG-GPU-<uuid>/<gi>/<ci>"); all kept as strings.
    """

    all: bool = True
    count: int | None = None
    refs: tuple[str, ...] = ()


class ReplicatedResource(Struct, frozen=True):
    name: str  # fully qualified
    replicas: int
    rename: str | None = None  # fully qualified; None keeps `name`
    devices: DeviceSelection = field(default_factory=DeviceSelection)
    # sharing.mps in DRA mode: every claim on these GPUs gets exactly one share
    # (nvdp.dra.claims.sharing.strict).
    strict_shares: bool = False


class ReplicatedResources(Struct, frozen=True):
    resources: tuple[ReplicatedResource, ...]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False


class Sharing(Struct, frozen=True):
    time_slicing: ReplicatedResources | None = None
    mps: ReplicatedResources | None = None

    @property
    def strategy(self) -> SharingStrategy:
        if self.mps is not None and any(r.replicas > 1 for r in self.mps.resources):
            return "mps"
        if self.time_slicing is not None and any(r.replicas > 1 for r in self.time_slicing.resources):
            return "time-slicing"
        return "none"


class Imex(Struct, frozen=True):
    channel_ids: tuple[int, ...] = ()
    required: bool = False


class Config(Struct, frozen=True):
    version: str = "v1"
    flags: Flags = field(default_factory=Flags)
    resources: Resources = field(default_factory=Resources)
    sharing: Sharing = field(default_factory=Sharing)
    imex: Imex = field(default_factory=Imex)
    # Where the values came from, for logs: a file path, or "defaults".
    source: str = "defaults"
