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
