"""What a node has, as plain data: filled from NVML or from a node profile, read by the plan."""

from __future__ import annotations

from msgspec import Struct

# NVML's nvmlGpuTopologyLevel_t values; lower is closer.
TOPOLOGY_LEVELS: dict[int, str] = {
    0: "internal",  # same board (multi-GPU boards)
    10: "single",  # one PCIe switch
    20: "multiple",  # several PCIe switches, no host bridge
    30: "hostbridge",  # one host bridge
    40: "node",  # host bridges within one NUMA node
    50: "system",  # across the SMP interconnect (NUMA nodes)
}


class MigAttributes(Struct, frozen=True):
    """NVML's nvmlDeviceAttributes_t of a MIG device (what GPU feature discovery labels)."""

    multiprocessors: int = 0
    slices_gi: int = 0
    slices_ci: int = 0
    engines_copy: int = 0
    engines_decoder: int = 0
    engines_encoder: int = 0
    engines_jpeg: int = 0
    engines_ofa: int = 0
    memory_mib: int = 0  # MemorySizeMB as NVML reports it for the MIG device


class MigDevice(Struct, frozen=True):
    uuid: str  # "MIG-..."
    index: int  # enumeration index under its parent (the j of "i:j")
    parent_uuid: str
    parent_index: int
    profile: str  # "1g.10gb", "1g.10gb+me"
    gi_id: int
    ci_id: int
    memory_bytes: int
    attributes: MigAttributes | None = None  # None: not read (NVML without the call)
    # The GPU instance behind the device (nvmlGpuInstanceGetInfo); None: not read.
    gi_profile_id: int | None = None  # the GI profile id `nvidia-smi mig -lgip` lists (19 for 1g.10gb)
    placement_start: int | None = None  # first memory slice of the instance
    placement_size: int | None = None  # memory slices it spans

    @property
    def index_id(self) -> str:
        return f"{self.parent_index}:{self.index}"


class MigProfile(Struct, frozen=True):
    """A GPU-instance profile a MIG-capable GPU supports and where an instance of it can go, as NVML
    reports them (nvmlDeviceGetGpuInstanceProfileInfoV, nvmlDeviceGetGpuInstancePossiblePlacements_v2).
    NVML answers these with MIG mode off too, so a node can publish what it could make."""

    name: str  # "1g.10gb", "1g.10gb+me"
    profile_index: int  # NVML_GPU_INSTANCE_PROFILE_* (0 is 1_SLICE, 7 is 1_SLICE_REV1, ...)
    gi_profile_id: int  # the id `nvidia-smi mig -lgip` lists and instance creation takes (19 for 1g.10gb)
    slices: int  # compute slices (sliceCount)
    instances: int  # how many instances of it can exist at once (instanceCount)
    memory_mib: int  # memorySizeMB
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    # Where an instance can start and how many of the GPU's memory slices it spans, in NVML's order.
    placements: tuple[tuple[int, int], ...] = ()


class Fabric(Struct, frozen=True):
    """The NVLink fabric a GPU has registered with (nvmlDeviceGetGpuFabricInfo, state completed)."""

    cluster_uuid: str  # "00000000-0000-0000-0000-000000000001"
    clique_id: int


class Gpu(Struct, frozen=True):
    index: int
    uuid: str  # "GPU-..."
    name: str  # product name, e.g. "Tesla T4"
    memory_bytes: int
    compute_capability: tuple[int, int]
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str
    numa_node: int | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    # What MIG could make on this GPU (read for MIG-capable GPUs; () when NVML does not answer).
    mig_profiles: tuple[MigProfile, ...] = ()
    fabric: Fabric | None = None  # None: not attached to an NVLink fabric (or not read)
    brand: str = ""  # "Tesla", "Nvidia", ... as go-nvlib's GetBrandAsString names it; "": not read
    architecture: str = ""  # "Turing", "Hopper", ... as go-nvlib's GetArchitectureAsString; "": unknown
    pcie_root: str | None = None  # PCIe root complex from sysfs, "pci0000:16"; None: not known
    # How the GPU addresses system memory (nvmlDeviceGetAddressingMode), go-nvlib's name: "HMM", "ATS"
    # (GH200, GB200), "None" (supported, inactive); "": NVML answered NOT_SUPPORTED, or not read.
    addressing_mode: str = ""


class Link(Struct, frozen=True):
    """Topology between two GPUs (by index), used to prefer well-connected sets."""

    a: int
    b: int
    nvlinks: int  # active NVLink links joining the pair
    pcie_level: int  # a TOPOLOGY_LEVELS key


class LostGpu(Struct, frozen=True):
    """A GPU that NVML reports but that could not be read (fell off the bus, ...)."""

    index: int
    uuid: str | None
    reason: str


class Inventory(Struct, frozen=True):
    driver_version: str
    cuda_driver_version: str  # "12.4"
    gpus: tuple[Gpu, ...] = ()
    links: tuple[Link, ...] = ()
    lost: tuple[LostGpu, ...] = ()

    def gpu(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def link(self, a: int, b: int) -> Link | None:
        lo, hi = min(a, b), max(a, b)
        return next((lk for lk in self.links if lk.a == lo and lk.b == hi), None)
