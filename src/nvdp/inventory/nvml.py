"""Inventory discovery through NVML (pynvml). All NVML calls of the inventory stay in this module.

Everything returned is plain data from nvdp.inventory.model. A GPU that cannot be read at start-up
(fell off the bus, ...) is reported in Inventory.lost and left out; the other GPUs are still served.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

import pynvml

from nvdp.inventory.facts import ADDRESSING_MODES, architecture_from_cc, architecture_name, brand_name
from nvdp.inventory.library import LIBRARY_NAME, candidate_paths, find_library
from nvdp.inventory.model import Fabric, Gpu, Inventory, Link, LostGpu, MigAttributes, MigDevice, MigProfile

# Where the host's /sys is (default /sys); the stand-in node points it at a tree of its own.
SYSFS_ROOT_ENV = "NVDP_SYSFS_ROOT"
_load_lock = threading.Lock()
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
# Calls a driver may lack or refuse for a device; the fact then keeps its default.
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_FIX_RUNTIME = (
    "Fix: run the plugin with the NVIDIA container runtime (`runtimeClassName: nvidia`, chart value "
    "runtimeClassName), or make `nvidia` the default runtime of containerd/docker. If this is not a GPU "
    "node, deploy the plugin only to GPU nodes (nodeSelector or node affinity)."
)


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node; the message says why and what to change.

    `code` is the NVML return code (pynvml.NVML_ERROR_*), or None when no library was found.
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def error_name(code: int) -> str:
    """NVML's name for a return code in the form NVIDIA's plugin logs it, e.g. ERROR_GPU_IS_LOST."""
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name.removeprefix("NVML_")
    return f"ERROR_{code}"


def _explain_init_failure(code: int, message: str, driver_root: str, container_driver_root: str) -> str:
    name = error_name(code)
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        broken = _default_search_error()
        if broken is not None:
            return _unloadable(LIBRARY_NAME, broken)
        looked = ", ".join(str(p) for p in candidate_paths(container_driver_root))
        return (
            f"NVML is not available ({name}): {LIBRARY_NAME} was not found under the container driver root "
            f"({looked}) nor on the library path, so the container runtime did not inject the NVIDIA driver "
            f"(host driver root {driver_root} is expected at {container_driver_root}). {_FIX_RUNTIME}"
        )
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return (
            f"NVML is not available ({name}): the NVIDIA kernel driver is not loaded on this node. "
            "Fix: install the driver and load it (`modprobe nvidia`, check `nvidia-smi` on the host); "
            "if this is not a GPU node, deploy the plugin only to GPU nodes (nodeSelector or node affinity)."
        )
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return (
            f"NVML is not available ({name}): the NVML library does not match the loaded kernel module, "
            "which happens after a driver upgrade. Fix: reboot the node, or unload and reload the nvidia "
            "kernel modules, so the running driver matches the installed library."
        )
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return (
            f"NVML is not available ({name}): insufficient permissions to open the NVIDIA device nodes "
            "(/dev/nvidiactl, /dev/nvidia*). Fix: run the plugin privileged or with access to those devices, "
            "as the chart's default security context does."
        )
    return f"NVML is not available ({name}: {message}). {_FIX_RUNTIME}"


def load_library(container_driver_root: str = "/driver-root") -> Path | None:
    """Point pynvml at the driver root's libnvidia-ml.so.1 when there is one; returns the path used.

    pynvml loads "libnvidia-ml.so.1" by name on first init unless its library handle is already set;
    setting that handle (under pynvml's own load lock) is how a specific file is chosen. None: the
    loader's default search applies.
    """
    path = find_library(container_driver_root)
    if path is None:
        return None
    with _load_lock, pynvml.libLoadLock:
        if pynvml.nvmlLib is None:
            try:
                pynvml.nvmlLib = ctypes.CDLL(str(path))
            except OSError as err:
                raise NvmlUnavailable(_unloadable(str(path), err)) from None
    return path


def _unloadable(path: str, err: OSError) -> str:
    return (
        f"NVML is not available: {path} was found but cannot be loaded ({err}), so the file is damaged, "
        "truncated or built for another architecture. Fix: reinstall or repair the NVIDIA driver on the "
        "host (nvidia-smi on the host fails the same way)."
    )


def _default_search_error() -> OSError | None:
    """Why the loader's own search could not load the library, when a file was there (else None)."""
    try:
        ctypes.CDLL(LIBRARY_NAME)
    except OSError as err:
        return None if "No such file or directory" in str(err) else err
    return None


class NvmlSession:
    """nvmlInit on enter, nvmlShutdown on exit; init failures become NvmlUnavailable with a fix.

    NVML counts init/shutdown pairs, so sessions may nest and other code (the health loop) may hold its
    own reference at the same time.
    """

    def __init__(self, driver_root: str = "/", container_driver_root: str = "/driver-root") -> None:
        self.driver_root = driver_root
        self.container_driver_root = container_driver_root

    def __enter__(self) -> NvmlSession:
        load_library(self.container_driver_root)  # raises NvmlUnavailable for a file that does not load
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(
                _explain_init_failure(e.value, str(e), self.driver_root, self.container_driver_root), e.value
            ) from None
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # a failing shutdown leaves nothing to repair
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def discover(driver_root: str = "/", container_driver_root: str = "/driver-root") -> Inventory:
    """Every GPU and MIG device NVML reports, driver and CUDA versions, and pairwise topology."""
    with NvmlSession(driver_root, container_driver_root):
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        gpus: list[Gpu] = []
        lost: list[LostGpu] = []
        handles: dict[int, Any] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            uuid: str | None = None
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                gpus.append(_read_gpu(index, uuid, handle))
                handles[index] = handle
            except pynvml.NVMLError as e:
                lost.append(LostGpu(index=index, uuid=uuid, reason=_lost_reason(e)))
        links = _read_links(gpus, handles)
    return Inventory(
        driver_version=driver,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        gpus=tuple(gpus),
        links=links,
        lost=tuple(lost),
    )


def _lost_reason(e: pynvml.NVMLError) -> str:
    if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
        return (
            "GPU is lost (ERROR_GPU_IS_LOST): it fell off the bus or stopped responding; look for Xid 79 in "
            "the kernel log, then reset the GPU or reboot the node"
        )
    return f"cannot be read through NVML ({error_name(e.value)}: {e})"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read_gpu(index: int, uuid: str, handle: Any) -> Gpu:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
    mig_capable, mig_enabled = _mig_mode(handle)
    cc = (int(major), int(minor))
    return Gpu(
        index=index,
        uuid=uuid,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(memory.total),
        compute_capability=cc,
        minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
        pci_bus_id=bus_id,
        numa_node=numa_node(bus_id),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=read_mig_devices(index, uuid, handle) if mig_enabled else (),
        mig_profiles=read_mig_profiles(handle) if mig_capable else (),
        fabric=_fabric(handle),
        brand=_brand(handle),
        architecture=_architecture(handle, cc),
        pcie_root=pcie_root(bus_id),
        addressing_mode=_addressing_mode(handle),
    )


def _addressing_mode(handle: Any) -> str:
    """go-nvlib's GetAddressingModeAsString: "HMM", "ATS" or "None"; "" where NVML does not support the
    call (no mode to report, or a driver without it) or answers a mode go-nvlib has no name for."""
    try:
        return ADDRESSING_MODES.get(int(pynvml.nvmlDeviceGetAddressingMode(handle)), "")
    except pynvml.NVMLError as e:
        if e.value in _ABSENT:
            return ""
        raise


def _brand(handle: Any) -> str:
    """go-nvlib's GetBrandAsString name of the GPU's brand; "" when NVML cannot tell."""
    try:
        return brand_name(int(pynvml.nvmlDeviceGetBrand(handle)))
    except pynvml.NVMLError as e:
        if e.value in _ABSENT:
            return ""
        raise


def _architecture(handle: Any, cc: tuple[int, int]) -> str:
    """go-nvlib's GetArchitectureAsString name; from the compute capability on drivers without the call."""
    try:
        return architecture_name(int(pynvml.nvmlDeviceGetArchitecture(handle)))
    except pynvml.NVMLError as e:
        if e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            return architecture_from_cc(cc)
        if e.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return ""
        raise


def _fabric(handle: Any) -> Fabric | None:
    """The NVLink fabric clique, when the GPU's registration completed (go-nvlib's IsFabricAttached:
    state completed, status success, a cluster UUID that is not all zeros); None otherwise."""
    try:
        info: Any = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError as e:
        if e.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            return None  # not supported (no NVSwitch fabric), or unreadable: not attached
        try:  # drivers that only have the versioned call
            info = pynvml.c_nvmlGpuFabricInfoV_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except pynvml.NVMLError:
            return None
    cluster = bytes(info.clusterUuid)
    if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != pynvml.NVML_SUCCESS:
        return None
    if cluster == bytes(16):
        return None
    return Fabric(cluster_uuid=str(UUID(bytes=cluster)), clique_id=int(info.cliqueId))


def _mig_mode(handle: Any) -> tuple[bool, bool]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as e:
        if e.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return False, False
        raise
    return True, current == pynvml.NVML_DEVICE_MIG_ENABLE


def mig_device_handles(handle: Any) -> Iterator[tuple[int, Any]]:
    """(slot, handle) of each MIG device present on the GPU `handle`."""
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            yield j, pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_NOT_FOUND:
                continue  # an empty slot: MIG devices need not be numbered densely
            raise


def read_mig_devices(parent_index: int, parent_uuid: str, handle: Any) -> tuple[MigDevice, ...]:
    devices: list[MigDevice] = []
    for j, mig in mig_device_handles(handle):
        name = _text(pynvml.nvmlDeviceGetName(mig))
        gi_id = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
        gi_profile_id, placement_start, placement_size = _gpu_instance(handle, gi_id)
        devices.append(
            MigDevice(
                uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                index=j,
                parent_uuid=parent_uuid,
                parent_index=parent_index,
                profile=mig_profile_from_name(name),
                gi_id=gi_id,
                ci_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
                memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(mig).total),
                attributes=_mig_attributes(mig),
                gi_profile_id=gi_profile_id,
                placement_start=placement_start,
                placement_size=placement_size,
            )
        )
    return tuple(devices)


def read_mig_profiles(handle: Any) -> tuple[MigProfile, ...]:
    """Every GPU-instance profile the GPU supports, with its possible placements (MIG mode on or off).
    A profile index the GPU lacks answers NOT_SUPPORTED (INVALID_ARGUMENT past the driver's count);
    a driver without the calls gives ()."""
    profiles: list[MigProfile] = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                return ()
            if e.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        profiles.append(
            MigProfile(
                name=_text(info.name).removeprefix("MIG "),  # as nvidia-smi shows it, or bare
                profile_index=index,
                gi_profile_id=int(info.id),
                slices=int(info.sliceCount),
                instances=int(info.instanceCount),
                memory_mib=int(info.memorySizeMB),
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=_possible_placements(handle, int(info.id)),
            )
        )
    return tuple(profiles)


def _possible_placements(handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
    """nvmlDeviceGetGpuInstancePossiblePlacements_v2: asked for the count first, then the placements."""
    try:
        function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    except pynvml.NVMLError as e:
        if e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            return ()
        raise
    count = ctypes.c_uint(0)
    status = function(handle, profile_id, None, ctypes.byref(count))
    if status not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
        raise pynvml.NVMLError(status)
    slots = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    status = function(handle, profile_id, slots, ctypes.byref(count))
    if status != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(status)
    return tuple((int(slots[k].start), int(slots[k].size)) for k in range(count.value))


def _gpu_instance(parent: Any, gi_id: int) -> tuple[int | None, int | None, int | None]:
    """GI profile id, placement start and size of a GPU instance; all None when NVML does not tell
    (no permission to read GPU instances, or a driver without the calls)."""
    try:
        info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(parent, gi_id))
    except pynvml.NVMLError as e:
        if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise
        return None, None, None
    return int(info.profileId), int(info.placement.start), int(info.placement.size)


def _mig_attributes(mig: Any) -> MigAttributes | None:
    try:
        a = pynvml.nvmlDeviceGetAttributes(mig)
    except pynvml.NVMLError as e:
        if e.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return None  # an old driver: GPU feature discovery then leaves these labels out
        raise
    return MigAttributes(
        multiprocessors=int(a.multiprocessorCount),
        slices_gi=int(a.gpuInstanceSliceCount),
        slices_ci=int(a.computeInstanceSliceCount),
        engines_copy=int(a.sharedCopyEngineCount),
        engines_decoder=int(a.sharedDecoderCount),
        engines_encoder=int(a.sharedEncoderCount),
        engines_jpeg=int(a.sharedJpegCount),
        engines_ofa=int(a.sharedOfaCount),
        memory_mib=int(a.memorySizeMB),
    )


def mig_profile_from_name(name: str) -> str:
    """NVML names a MIG device "<GPU name> MIG <profile>", e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile if sep else name


def numa_node(bus_id: str, sysfs_root: str | None = None) -> int | None:
    """The GPU's NUMA node as sysfs reports it for its PCI device, as NVIDIA's plugin reads it.

    Not NVML's nvmlDeviceGetNumaNodeId: on coherent systems (GH200, GB200) that is the node of the GPU's
    own memory, while the kubelet's topology manager needs the CPU node the device hangs off.
    """
    root = sysfs_root if sysfs_root is not None else os.environ.get(SYSFS_ROOT_ENV, "/sys")
    # sysfs names the device by a 4-digit domain in lower case: 00000000:3B:00.0 -> 0000:3b:00.0
    domain, _, rest = bus_id.partition(":")
    path = Path(root) / "bus/pci/devices" / f"{domain[-4:]}:{rest}".lower() / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def pcie_root(bus_id: str, sysfs_root: str | None = None) -> str | None:
    """The PCIe root complex ("pci0000:16") of a PCI device: the first part of the /sys/devices path its
    /sys/bus/pci/devices link points to, as Kubernetes' deviceattribute package reads it; None if unknown."""
    root = sysfs_root if sysfs_root is not None else os.environ.get(SYSFS_ROOT_ENV, "/sys")
    domain, _, rest = bus_id.partition(":")
    address = f"{domain[-4:]}:{rest}".lower()
    try:
        target = os.readlink(Path(root) / "bus/pci/devices" / address)
    except OSError:
        return None
    # relative (as the kernel writes it) from bus/pci/devices, or absolute
    parts = Path(os.path.normpath(Path("bus/pci/devices") / target)).parts
    if parts[-1] != address:
        return None
    pairs = itertools.pairwise(parts[:-1])  # the device itself is never the root
    return next((nxt for part, nxt in pairs if part == "devices" and _PCIE_ROOT.match(nxt)), None)


def _read_links(gpus: list[Gpu], handles: dict[int, Any]) -> tuple[Link, ...]:
    nvlinks = {g.index: _nvlink_peers(handles[g.index]) for g in gpus}
    by_bus = {g.pci_bus_id.upper(): g.index for g in gpus}
    links: list[Link] = []
    for x, a in enumerate(gpus):
        for b in gpus[x + 1 :]:
            try:
                level = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a.index], handles[b.index]))
            except pynvml.NVMLError:
                continue  # no topology for this pair: the allocator treats it as unknown
            direct_a, switch_a = nvlinks[a.index]
            _, switch_b = nvlinks[b.index]
            count = sum(n for bus, n in direct_a.items() if by_bus.get(bus) == b.index)
            if switch_a and switch_b:
                count += min(switch_a, switch_b)
            links.append(Link(a=a.index, b=b.index, nvlinks=count, pcie_level=level))
    return tuple(links)


def _nvlink_peers(handle: Any) -> tuple[dict[str, int], int]:
    """Active NVLink links of one GPU: counts per remote GPU bus id, and links into NVSwitches."""
    direct: dict[str, int] = {}
    switch = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
        except pynvml.NVMLError:
            break  # no NVLink at all, or no more links on this GPU
        try:
            remote_type = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except pynvml.NVMLError:
            remote_type = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switch += 1
            continue
        try:
            bus = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).upper()
        except pynvml.NVMLError:
            continue
        direct[bus] = direct.get(bus, 0) + 1
    return direct, switch
