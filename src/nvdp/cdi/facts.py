"""What the host has for CDI, as plain data: roots, driver files, device nodes (already stat'ed).

Filled by `nvdp.cdi.host.discover_host` (the filesystem edge), read by `nvdp.cdi.build` (pure), so
every spec rule is tested on records a test writes by hand. Every path is twofold: `path` is where
the container gets it (the path inside the driver root), `host_path` where the host has it (the
target root applied), which is what a container runtime on the host opens.
"""

from __future__ import annotations

from msgspec import Struct, field

from nvdp.config.model import Config

GATED_MODES = ("gdrcopy", "gds", "mofed")


class Roots(Struct, frozen=True):
    """The four roots, with NVIDIA's meanings (its --container-driver-root, --driver-root, --dev-root).

    `driver_root` is where the plugin sees the host's driver files (the configured container driver
    root, /driver-root by default, when it exists, else /); `target_driver_root` is that tree's path on
    the host (flags.nvidiaDriverRoot). `dev_root` is where the plugin sees the device nodes (the driver
    root when it has a dev/ folder, else /), `target_dev_root` their host root (flags.nvidiaDevRoot,
    defaulting to the driver root).
    """

    driver_root: str = "/"
    target_driver_root: str = "/"
    dev_root: str = "/"
    target_dev_root: str = "/"


class HostFile(Struct, frozen=True):
    """A driver file or folder to bind-mount."""

    path: str  # in the container (and inside the driver root)
    host_path: str


class Library(Struct, frozen=True):
    """A driver library to bind-mount, with what the symlink hook and the hook-less mounts need."""

    path: str
    host_path: str
    soname: str | None = None  # DT_SONAME (the file name when it has none); None: not a readable ELF


class Node(Struct, frozen=True):
    """A device node, from a stat of the host's node, or from /proc when the host has none (`host_path`
    empty: the runtime then creates it from type, major and minor)."""

    path: str  # /dev/... in the container
    host_path: str = ""
    type: str = ""  # "c" for a node described from /proc; "" when stat'ed (the runtime reads it)
    major: int = 0
    minor: int = 0
    mode: int | None = None  # permission bits; None when unknown
    gid: int = 0


class GatedFiles(Struct, frozen=True):
    """The files of one of NVIDIA's "gated" modes (gdrcopy, gds, mofed) found on this node."""

    nodes: tuple[Node, ...] = ()
    mounts: tuple[HostFile, ...] = ()


class HostFacts(Struct, frozen=True):
    """Everything discovery found. Maps are keyed as the builder looks them up: GPU nodes by minor, DRM
    nodes and by-path links by PCI bus ID (sysfs form, `0000:3b:00.0`), MIG capabilities by their
    mig-minors name (`gpu0/gi1/access`), IMEX channels by number, gated files by mode."""

    roots: Roots
    driver_version: str
    lib_dirs: tuple[str, ...] = ()  # folders holding libcuda.so.<version> (NVIDIA_CTK_LIBCUDA_DIR)
    libraries: tuple[Library, ...] = ()  # *.so.<version> there and in vdpau/, nvvm70, explicit ones
    graphics: tuple[Library, ...] = ()  # EGL GBM/Wayland, allocator, Vulkan producer, Xorg modules
    configs: tuple[HostFile, ...] = ()
    firmware: tuple[HostFile, ...] = ()
    binaries: tuple[HostFile, ...] = ()
    ipc: tuple[HostFile, ...] = ()
    # Per library folder (container path), the names there that are symlinks: a SONAME link is made in
    # the container only where the host has one, as NVIDIA's toolkit decides.
    symlinks: dict[str, frozenset[str]] = field(default_factory=dict)
    control_nodes: tuple[Node, ...] = ()
    gpu_nodes: dict[int, Node] = field(default_factory=dict)
    drm_nodes: dict[str, tuple[Node, ...]] = field(default_factory=dict)
    drm_links: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "<target>::<link>"
    mig_caps: dict[str, Node] = field(default_factory=dict)
    imex_channels: dict[int, Node] = field(default_factory=dict)
    gated: dict[str, GatedFiles] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # what was left out and why, for the caller to log


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's PCI bus ID in sysfs's form, as go-nvlib writes it: lower case, and a 4-digit domain where
    NVML gives 8 digits starting 0000 (`00000000:3B:00.0` -> `0000:3b:00.0`)."""
    low = bus_id.lower()
    domain, sep, rest = low.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        return f"{domain[4:]}:{rest}"
    return low


def gated_modes(config: Config) -> tuple[str, ...]:
    """The gated modes the config enables (flags gdrcopyEnabled, gdsEnabled, mofedEnabled), in order."""
    flags = config.flags
    on = {"gdrcopy": flags.gdrcopy_enabled, "gds": flags.gds_enabled, "mofed": flags.mofed_enabled}
    return tuple(m for m in GATED_MODES if on[m])
