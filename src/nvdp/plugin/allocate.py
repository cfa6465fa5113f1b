"""What a container gets for the devices the kubelet picked: environment, mounts, device nodes, CDI names.

Pure: the filesystem facts it needs (which optional /dev nodes exist, the MIG capability minors) are
passed in, so the server reads them once at start and every Allocate is a plain computation.

The output matches NVIDIA's plugin for every deviceListStrategy so that existing container runtimes
and nvidia-container-toolkit set-ups keep working; the refusals say what to change instead of
"invalid request".

Unhealthy devices are not refused, as in NVIDIA's plugin: the kubelet only hands out devices it saw
healthy, so an unhealthy one here means the health change raced with admission, or a container of an
already admitted pod is restarting. Refusing would fail the pod with an UnexpectedAdmissionError the
user cannot act on; the allocation lists them in `unhealthy` so the server can log a warning.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from msgspec import Struct, field

from nvdp.cdi.names import ALL_DEVICE, kind_of, qualified
from nvdp.config.model import CDI_STRATEGIES, Config

# The node names and the MIG capability table live below the plugin, shared with the CDI spec; the
# names stay importable from here.
from nvdp.inventory.devnodes import CONTROL_DEVICE_PATHS as CONTROL_DEVICE_PATHS
from nvdp.inventory.devnodes import IMEX_CHANNEL_DEV_DIR as IMEX_CHANNEL_DEV_DIR
from nvdp.inventory.devnodes import MIG_CAP_DEV_DIR as MIG_CAP_DEV_DIR
from nvdp.inventory.devnodes import MIG_MINORS_FILE as MIG_MINORS_FILE
from nvdp.inventory.devnodes import mig_cap_keys as mig_cap_keys
from nvdp.inventory.devnodes import parse_mig_minors as parse_mig_minors
from nvdp.plan.ids import device_container_ids
from nvdp.plan.model import REPLICA_SEPARATOR, PlannedDevice, PlannedResource
from nvdp.text import short_list

CDI_ANNOTATION_PREFIX_DEFAULT = "cdi.k8s.io/"
CDI_ANNOTATION_PLUGIN_NAME = "nvidia-device-plugin"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
IMEX_CHANNELS_ENV = "NVIDIA_IMEX_CHANNELS"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
# The directory nvidia-container-runtime scans for volume-mounts device lists.
VOLUME_MOUNTS_DIR = "/var/run/nvidia-container-devices"
DEVICE_PERMISSIONS = "rw"
# How many advertised devices a refusal lists before summarising the rest.
_ADVERTISED_SHOWN = 4


class AllocationRefused(ValueError):
    """The request cannot be served as asked; the message names the resource, the cause and the fix.

    `reason` is a fixed word for the refusal counter (nvdp_allocation_refusals_total).
    """

    def __init__(self, message: str, reason: str = "invalid-request") -> None:
        super().__init__(message)
        self.reason = reason


class MountSpec(Struct, frozen=True):
    container_path: str
    host_path: str
    read_only: bool = False


class DeviceNode(Struct, frozen=True):
    container_path: str
    host_path: str
    permissions: str = DEVICE_PERMISSIONS


class ContainerAllocation(Struct, frozen=True):
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[MountSpec, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    # Requested devices that were unhealthy when allocated (not refused; see the module docstring).
    unhealthy: tuple[str, ...] = ()


def present_control_paths(exists: Callable[[str], bool]) -> frozenset[str]:
    """The control nodes to pass as device specs: those that exist at their own path in the plugin's
    container, where NVIDIA looks.

    NVIDIA v0.20.0 (internal/plugin/server.go, apiDeviceSpecs) stats each of CONTROL_DEVICE_PATHS as
    it is, /dev/nvidia-uvm and not <driver root>/dev/nvidia-uvm nor <dev root>/dev/nvidia-uvm, and
    skips the ones missing; the per-device nodes and IMEX channels that follow are not stat'ed there.
    Only the host path is put under the dev root (`flags.nvidiaDevRoot`).
    """
    return frozenset(p for p in CONTROL_DEVICE_PATHS if exists(p))


# --- validation -------------------------------------------------------------------------------------


def _describe_advertised(resource: PlannedResource) -> str:
    """Summarise the advertised IDs: replicas of one device collapse to `<id>::0..9`."""
    replicas: dict[str, list[int]] = {}
    plain: list[str] = []
    for device in resource.devices:
        if device.replica is None:
            plain.append(device.id)
        else:
            replicas.setdefault(device.base_id, []).append(device.replica)
    groups = list(plain)
    for base, numbers in replicas.items():
        numbers.sort()
        contiguous = numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        if contiguous and len(numbers) > 1:
            groups.append(f"{base}{REPLICA_SEPARATOR}{numbers[0]}..{numbers[-1]}")
        else:
            groups.extend(f"{base}{REPLICA_SEPARATOR}{n}" for n in numbers)
    if not groups:
        return "no devices"
    return short_list(groups, _ADVERTISED_SHOWN)


# A device ID is a UUID with a replica suffix (about 50 characters); anything longer is not one of
# ours, and echoing megabytes of it would make the error itself too large for the kubelet to read.
ID_SHOWN_CHARS = 80
IDS_SHOWN = 4


def shown_id(device_id: str) -> str:
    """`device_id` for a message or log line, cut to ID_SHOWN_CHARS."""
    if len(device_id) <= ID_SHOWN_CHARS:
        return device_id
    return f"{device_id[:ID_SHOWN_CHARS]}... ({len(device_id)} characters)"


def shown_ids(device_ids: Sequence[str], limit: int = IDS_SHOWN) -> str:
    """The first `limit` IDs, each cut, and how many more: a bounded line whatever the request."""
    return short_list([shown_id(i) for i in device_ids[:limit]], limit, total=len(device_ids))


def _sharing_setting(resource: PlannedResource) -> str:
    key = "mps" if resource.sharing == "mps" else "timeSlicing"
    return f"sharing.{key}.failRequestsGreaterThanOne"


def resolve_devices(resource: PlannedResource, device_ids: Sequence[str]) -> list[PlannedDevice]:
    """The planned devices behind `device_ids`, in request order; refuses what this resource cannot serve."""
    if not device_ids:
        raise AllocationRefused(
            f"{resource.name}: the request names no devices; the kubelet must send at least one",
            reason="no-devices",
        )
    devices: list[PlannedDevice] = []
    for device_id in device_ids:
        device = resource.device(device_id)
        if device is None:
            raise AllocationRefused(
                f'{resource.name}: unknown device "{shown_id(device_id)}"; this node advertises '
                f"{_describe_advertised(resource)}",
                reason="unknown-device",
            )
        devices.append(device)
    shared = resource.sharing in ("time-slicing", "mps") and any(d.replica is not None for d in devices)
    if shared and resource.fail_requests_greater_than_one and len(device_ids) > 1:
        raise AllocationRefused(
            f"{resource.name} is shared ({resource.sharing}, {resource.replicas} replicas) and allows "
            f"1 device per container; the request asked for {len(device_ids)}. Request {resource.name}: 1, "
            "or set "
            f"{_sharing_setting(resource)}: false",
            reason="shared-request-too-large",
        )
    return devices


# --- building the response --------------------------------------------------------------------------


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def cdi_names(ids: Sequence[str], config: Config, classes: Collection[str]) -> list[str]:
    """The CDI names for `ids`, in NVIDIA's order; the optional classes only when their spec exists.

    The `gpu` spec always exists while a CDI strategy serves (the plugin writes it before it
    registers); the IMEX channel, GDRCopy, GDS and MOFED specs only when their files were found.
    """
    names = [qualified(kind_of("gpu"), i) for i in ids]
    if "imex-channel" in classes:
        names += [qualified(kind_of("imex-channel"), str(ch)) for ch in config.imex.channel_ids]
    flags = config.flags
    extras = ((flags.gdrcopy_enabled, "gdrcopy"), (flags.gds_enabled, "gds"), (flags.mofed_enabled, "mofed"))
    for enabled, kind in extras:
        if enabled and kind in classes:
            names.append(qualified(kind_of(kind), ALL_DEVICE))
    return names


def _annotation_key(prefix: str, uuid: str) -> str:
    prefix = prefix or CDI_ANNOTATION_PREFIX_DEFAULT
    if not prefix.endswith("/"):
        prefix += "/"
    return f"{prefix}{CDI_ANNOTATION_PLUGIN_NAME}_{uuid}"


def _mps_parts(resource: PlannedResource, config: Config) -> tuple[dict[str, str], list[MountSpec]]:
    root = config.flags.mps_root
    if not root:
        raise AllocationRefused(
            f"{resource.name} is shared with MPS but flags.mpsRoot is empty, so there is no pipe "
            "directory to mount; set flags.mpsRoot (--mps-root / MPS_ROOT) to the MPS daemon's host "
            "directory, e.g. /run/nvidia/mps",
            reason="mps-root-unset",
        )
    pipe = f"/mps/{resource.name}/pipe"
    mounts = [
        MountSpec(container_path=pipe, host_path=posixpath.join(root, resource.name, "pipe")),
        MountSpec(container_path="/dev/shm", host_path=posixpath.join(root, "shm")),
    ]
    return {MPS_PIPE_ENV: pipe}, mounts


def _device_paths(
    resource: PlannedResource, devices: Sequence[PlannedDevice], mig_cap_minors: Mapping[str, int] | None
) -> list[str]:
    paths: list[str] = []
    for device in devices:
        paths.extend(f"/dev/nvidia{minor}" for minor in device.minors)
        if device.mig is None:
            continue
        gi_id, ci_id = device.mig
        for key in mig_cap_keys(device.minors[0], gi_id, ci_id):
            minor = None if mig_cap_minors is None else mig_cap_minors.get(key)
            if minor is None:
                raise AllocationRefused(
                    f"{resource.name}: no capability minor for MIG device {device.base_id} ({key}) in "
                    f"{MIG_MINORS_FILE}; the MIG layout changed since the plugin started, or the file is "
                    "not readable in the plugin container. Restart the plugin after reconfiguring MIG",
                    reason="mig-capability-missing",
                )
            paths.append(f"{MIG_CAP_DEV_DIR}/nvidia-cap{minor}")
    return _unique(paths)


def allocate_container(
    resource: PlannedResource,
    device_ids: Sequence[str],
    config: Config,
    *,
    dev_paths_present: Callable[[str], bool],
    mig_cap_minors: Mapping[str, int] | None,
    cdi_uuid: Callable[[], str],
    cdi_classes: Collection[str],
) -> ContainerAllocation:
    """The response for one container asking for `device_ids` of `resource`.

    `dev_paths_present(path)` says whether an optional control node (`/dev/nvidia-uvm`, ...) exists
    (`present_control_paths`);
    `mig_cap_minors` is `parse_mig_minors` of the node's table (None when it could not be read);
    `cdi_uuid()` makes the unique part of the CDI annotation key;
    `cdi_classes` are the CDI classes whose specs the plugin wrote (`SpecSet.classes()`): an optional
    class (imex-channel, gdrcopy, gds, mofed) is named only when it is among them.
    """
    devices = resolve_devices(resource, device_ids)
    plugin = config.flags.plugin
    strategies = set(plugin.device_list_strategy)
    ids = device_container_ids(devices, config.flags.plugin.device_id_strategy)
    channels = [str(ch) for ch in config.imex.channel_ids]

    envs: dict[str, str] = {}
    mounts: list[MountSpec] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []

    if strategies & CDI_STRATEGIES:
        names = cdi_names(ids, config, cdi_classes)
        if "cdi-annotations" in strategies:
            annotations[_annotation_key(plugin.cdi_annotation_prefix, cdi_uuid())] = ",".join(names)
        if "cdi-cri" in strategies:
            cdi_devices = names
    if resource.sharing == "mps":
        mps_envs, mps_mounts = _mps_parts(resource, config)
        envs.update(mps_envs)
        mounts.extend(mps_mounts)
    for enabled, env in (
        (config.flags.gdrcopy_enabled, "NVIDIA_GDRCOPY"),
        (config.flags.gds_enabled, "NVIDIA_GDS"),
        (config.flags.mofed_enabled, "NVIDIA_MOFED"),
    ):
        if enabled:
            envs[env] = "enabled"

    nodes: list[DeviceNode] = []
    if strategies & {"envvar", "volume-mounts"}:
        if "envvar" in strategies:
            envs[VISIBLE_DEVICES_ENV] = ",".join(ids)
            if channels:
                envs[IMEX_CHANNELS_ENV] = ",".join(channels)
        if "volume-mounts" in strategies:
            # Overrides the envvar value on purpose: the runtime then reads the list from the mounts.
            envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_DIR
            mounts.extend(MountSpec(f"{VOLUME_MOUNTS_DIR}/{i}", "/dev/null") for i in ids)
            mounts.extend(MountSpec(f"{VOLUME_MOUNTS_DIR}/imex/{ch}", "/dev/null") for ch in channels)
        if plugin.pass_device_specs:
            paths = [p for p in CONTROL_DEVICE_PATHS if dev_paths_present(p)]
            paths += _device_paths(resource, devices, mig_cap_minors)
            paths += [f"{IMEX_CHANNEL_DEV_DIR}/channel{ch}" for ch in channels]
            dev_root = config.flags.dev_root
            nodes = [DeviceNode(p, posixpath.join(dev_root, p.lstrip("/"))) for p in _unique(paths)]

    return ContainerAllocation(
        envs=envs,
        mounts=tuple(mounts),
        devices=tuple(nodes),
        annotations=annotations,
        cdi_devices=tuple(cdi_devices),
        unhealthy=tuple(_unique(d.id for d in devices if not d.healthy)),
    )
