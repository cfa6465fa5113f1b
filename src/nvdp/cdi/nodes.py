"""The device nodes a container gets, stat'ed on the host: control, GPU, DRM, MIG capabilities, IMEX
channels, and the gated modes' nodes.

The edge that reads /dev (under the dev root), sysfs and /proc. A node is taken only if it is a
character device itself (lstat, as NVIDIA's toolkit checks: a symlink is not a node); its host path
is the target dev root's. MIG capability nodes the host has not created are described from /proc
instead (type, major, minor, mode), so a container still gets them (NVIDIA's spec would silently lack
them; nvdra#787).
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
import stat
from collections.abc import Iterable

from nvdp.cdi.facts import GatedFiles, HostFile, Node, Roots
from nvdp.cdi.locate import Tree
from nvdp.inventory.devnodes import (
    CONTROL_DEVICE_PATHS,
    MIG_MINORS_FILE,
    gpu_node,
    imex_channel_node,
    mig_cap_keys,
    mig_cap_node,
    parse_mig_minors,
)
from nvdp.inventory.model import Inventory

GATED_NODES = {
    "gdrcopy": ("/dev/gdrdrv",),
    "gds": ("/dev/nvidia-fs*",),
    "mofed": ("/dev/infiniband/uverbs*", "/dev/infiniband/rdma_cm"),
}
# GDS also mounts these (a folder, a file) from the driver root, but only when it found a node.
GDS_MOUNTS = (("/run/udev", True), ("/etc/cufile.json", False))
NVIDIA_CAPS_DEVICE = "nvidia-caps"  # its major, in /proc/devices
_CAP_LINE = re.compile(r"^(DeviceFileMinor|DeviceFileMode):\s*(\d+)\s*$", re.MULTILINE)


def under(root: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(root, path.lstrip("/")))


def stat_node(roots: Roots, path: str) -> Node | None:
    """The node at `path` under the dev root, when it is a character device there."""
    try:
        st = os.lstat(under(roots.dev_root, path))
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return Node(path, under(roots.target_dev_root, path), major=os.major(st.st_rdev),
                minor=os.minor(st.st_rdev), mode=stat.S_IMODE(st.st_mode), gid=st.st_gid)


def nodes(roots: Roots, patterns: Iterable[str]) -> tuple[Node, ...]:
    """The character devices matching `patterns` (globs of /dev paths) under the dev root, sorted."""
    found: list[Node] = []
    base = posixpath.normpath(roots.dev_root)
    for pattern in patterns:
        for full in sorted(glob.glob(posixpath.join(glob.escape(base), pattern.lstrip("/")))):
            path = "/" + posixpath.relpath(full, base).lstrip("/")
            node = stat_node(roots, path)
            if node is not None and node not in found:
                found.append(node)
    return tuple(found)


def control_nodes(roots: Roots) -> tuple[Node, ...]:
    return nodes(roots, CONTROL_DEVICE_PATHS)


def gpu_nodes(roots: Roots, inventory: Inventory) -> dict[int, Node]:
    found = {}
    for gpu in inventory.gpus:
        node = stat_node(roots, gpu_node(gpu.minor))
        if node is not None:
            found[gpu.minor] = node
    return found


def drm(roots: Roots, bus_id: str, sysfs_root: str) -> tuple[tuple[Node, ...], tuple[str, ...]]:
    """The DRM nodes of the GPU at `bus_id` (sysfs's `drm/` entries of its PCI device) and the
    `<target>::<link>` arguments for its /dev/dri/by-path links that point at one of them."""
    drm_dir = glob.escape(f"{sysfs_root}/bus/pci/devices/{bus_id}/drm")
    entries = sorted(glob.glob(posixpath.join(drm_dir, "*")))
    found = nodes(roots, [f"/dev/dri/{posixpath.basename(e)}" for e in entries])
    selected = {under(roots.dev_root, n.path) for n in found}
    links = []
    for suffix in ("card", "render"):
        link = f"/dev/dri/by-path/pci-{bus_id}-{suffix}"
        full = under(roots.dev_root, link)
        try:
            target = os.readlink(full)
        except OSError:
            continue
        if target.startswith("/"):
            pointed = under(roots.dev_root, target)
        else:
            pointed = posixpath.normpath(posixpath.join(posixpath.dirname(full), target))
        if pointed in selected:
            # The link's container path: NVIDIA writes it with the plugin's dev root in front (a path
            # that exists only in the plugin's container), which the hook cannot create in a container.
            links.append(f"{target}::{link}")
    return found, tuple(links)


def caps_major(proc_root: str) -> int | None:
    """The `nvidia-caps` character major from /proc/devices."""
    try:
        text = _read(f"{proc_root}/devices")
    except OSError:
        return None
    block = text.split("Block devices:", 1)[0]
    for line in block.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == NVIDIA_CAPS_DEVICE and parts[0].isdigit():
            return int(parts[0])
    return None


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _capability_file(proc_root: str, key: str) -> tuple[int | None, int | None]:
    """DeviceFileMinor and DeviceFileMode of a MIG capability from /proc/driver/nvidia/capabilities."""
    gpu, _, rest = key.partition("/")
    try:
        text = _read(f"{proc_root}/driver/nvidia/capabilities/{gpu}/mig/{rest}")
    except OSError:
        return None, None
    values = dict(_CAP_LINE.findall(text))
    minor, mode = values.get("DeviceFileMinor"), values.get("DeviceFileMode")
    return (int(minor) if minor else None), (int(mode) if mode else None)


def mig_caps(roots: Roots, inventory: Inventory, proc_root: str, warnings: list[str], *,
             made_on_demand: bool = False) -> dict[str, Node]:
    """The GI and CI capability nodes of every MIG device, by mig-minors name. `made_on_demand`
    (migStrategy dynamic): of every GPU instance and compute instance mig-minors lists for the
    MIG-capable GPUs, as NVML numbers a MIG device only when a claim's prepare makes it.

    The minor comes from mig-minors, else from the capability's own /proc file. The host node is
    stat'ed when it exists (NVIDIA's form); else the node is described from /proc (type c, the
    nvidia-caps major, the minor, DeviceFileMode) with no host path, and the runtime creates it.
    """
    keys = [k for g in inventory.gpus if g.mig_enabled for m in g.mig_devices
            for k in mig_cap_keys(g.minor, m.gi_id, m.ci_id)]
    capable = [g.minor for g in inventory.gpus if g.mig_capable] if made_on_demand else []
    if not keys and not capable:
        return {}
    minors_file = proc_root.rstrip("/") + MIG_MINORS_FILE.removeprefix("/proc")
    try:
        minors = parse_mig_minors(_read(minors_file))
    except (OSError, ValueError) as err:
        warnings.append(f"{minors_file} not read ({err}); MIG capability minors from "
                        f"{proc_root}/driver/nvidia/capabilities instead")
        minors = {}
    prefixes = tuple(f"gpu{minor}/gi" for minor in capable)
    keys += [k for k in minors if prefixes and k.startswith(prefixes)]
    major: int | None = None
    found: dict[str, Node] = {}
    for key in dict.fromkeys(keys):
        minor, mode = minors.get(key), None
        if minor is None:
            minor, mode = _capability_file(proc_root, key)
        if minor is None:
            continue  # the builder names the MIG device that lacks it
        node = stat_node(roots, mig_cap_node(minor))
        if node is None:
            if mode is None:
                mode = _capability_file(proc_root, key)[1]
            major = major if major is not None else caps_major(proc_root)
            if major is None:
                warnings.append(f"no {NVIDIA_CAPS_DEVICE} major in {proc_root}/devices for {key}")
                continue
            node = Node(mig_cap_node(minor), type="c", major=major, minor=minor, mode=mode)
        found[key] = node
    return found


def imex_channels(roots: Roots, channels: Iterable[int]) -> dict[int, Node]:
    """The configured IMEX channels that exist: under the dev root, else at their own path (as NVIDIA
    looks, links followed). Only path and host path are kept: NVIDIA's spec gives no more."""
    found = {}
    for channel in channels:
        path = imex_channel_node(channel)
        for candidate in dict.fromkeys([under(roots.dev_root, path), path]):
            try:
                is_char = stat.S_ISCHR(os.stat(candidate).st_mode)
            except OSError:
                continue
            if is_char:
                found[channel] = Node(path, under(roots.target_dev_root, path))
                break
    return found


def gated(roots: Roots, tree: Tree, target_driver_root: str, modes: Iterable[str]) -> dict[str, GatedFiles]:
    """The nodes (and for GDS the mounts) of each enabled gated mode; modes with nothing are left out."""
    found = {}
    for mode in modes:
        mode_nodes = nodes(roots, GATED_NODES[mode])
        mounts: list[HostFile] = []
        if mode == "gds" and mode_nodes:
            for path, is_dir in GDS_MOUNTS:
                keep = os.path.isdir if is_dir else os.path.isfile
                hits = tree.matches(["/"], path, keep=keep)
                mounts += [HostFile(p, under(target_driver_root, p)) for p in hits]
        if mode_nodes:
            found[mode] = GatedFiles(mode_nodes, tuple(mounts))
    return found
