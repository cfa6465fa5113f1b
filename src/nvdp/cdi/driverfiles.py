"""The driver's files a container gets: libraries, graphics files, configs, firmware, binaries, IPC.

The edge that finds them in the driver tree, by NVIDIA's toolkit's lists and search orders
(pkg/nvcdi/driver-nvml.go, internal/discover/graphics.go, ipc.go). A file that is not there is
left out, as NVIDIA leaves it out; only a missing libcuda stops the spec (host.py).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping

from nvdp.cdi.elf import read_soname
from nvdp.cdi.errors import CdiError
from nvdp.cdi.facts import HostFile, Library
from nvdp.cdi.locate import Tree

NVVM_LEGACY = "libnvidia-nvvm70.so.*"
# Feature flag enable-explicit-driver-libraries: these, by exact name, in the driver's folders.
EXPLICIT_LIBRARIES = (
    "libEGL.so", "libGL.so", "libGLESv1_CM.so", "libGLESv2.so", "libGLX.so", "libGLdispatch.so",
    "libOpenCL.so", "libOpenGL.so", "libnvidia-api.so", "libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so",
)  # fmt: skip
# Libraries without the driver's version in their names (*.*: their own X.Y.Z), and two with it that the
# graphics symlinks need.
GRAPHICS_LIBRARIES = (
    "libnvidia-egl-gbm.so.*.*", "libnvidia-egl-wayland.so.*.*", "libnvidia-egl-wayland2.so.*.*",
    "libnvidia-allocator.so.{version}", "libnvidia-vulkan-producer.so.{version}",
)  # fmt: skip
XORG_FILES = ("nvidia_drv.so", "libglxserver_nvidia.so.{version}")
XORG_SUBDIRS = (
    "modules/drivers", "modules/extensions", "modules/updates/drivers", "modules/updates/extensions",
)  # fmt: skip
XORG_ROOTS = ("/usr/lib/xorg", "/usr/lib64/xorg", "/usr/X11R6/lib", "/usr/X11R6/lib64")
CONFIG_FILES = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
    "OpenCL/vendors/nvidia.icd",
)
# Mounted under /etc/ in the container wherever the host keeps them (GKE: <root>/vulkan/...).
VULKAN_FILES = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
)
VULKAN_ARCH_FILES = {
    "x86_64": "vulkan/icd.d/nvidia_icd.x86_64.json",
    "aarch64": "vulkan/icd.d/nvidia_icd.aarch64.json",
}
BINARIES = (
    "nvidia-smi",  # system management interface
    "nvidia-debugdump",  # GPU core dumps
    "nvidia-persistenced",  # persistence mode
    "nvidia-cuda-mps-control",  # MPS command line
    "nvidia-cuda-mps-server",  # MPS server
    "nvidia-imex",  # IMEX daemon
    "nvidia-imex-ctl",  # IMEX control
)
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
IPC_DIRS = ("/run", "/var/run")
# NVIDIA looks for this with its file filter, which refuses folders: a real MPS pipe folder is never
# mounted. nvdp does the same (MPS sharing mounts its own pipe folder per resource).
MPS_PIPE = "/tmp/nvidia-mps"
FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                 "/lib/firmware")
CONFIG_DIRS = ("/etc",)
DATA_DIRS = ("/usr/local/share", "/usr/share")  # XDG_DATA_DIRS when that is set, as NVIDIA reads it


def _unique(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(paths))


def _library(tree: Tree, target_root: str, inside: str) -> Library:
    return Library(inside, _host(target_root, inside), read_soname(tree.full(inside)))


def _host(target_root: str, inside: str) -> str:
    return posixpath.normpath(posixpath.join(target_root, inside.lstrip("/")))


def _file(target_root: str, inside: str, path: str | None = None) -> HostFile:
    return HostFile(path or inside, _host(target_root, inside))


def libcuda_dirs(tree: Tree, version: str) -> tuple[str, ...]:
    """The folders holding libcuda.so.<version>: NVIDIA_CTK_LIBCUDA_DIR, and where the versioned
    libraries are looked for."""
    return tuple(_unique(posixpath.dirname(p) for p in tree.libraries(f"libcuda.so.{version}")))


def version_from_files(tree: Tree) -> str | None:
    """The driver version from a library's suffix (libcuda.so.550.54.15), when NVML gave none."""
    for prefix in ("libcuda.so.", "libnvidia-ml.so."):
        found = tree.libraries(prefix + "*.*")
        if found:
            return posixpath.basename(found[0]).removeprefix(prefix)
    return None


def libraries(tree: Tree, target_root: str, lib_dirs: tuple[str, ...], version: str,
              explicit: bool) -> tuple[Library, ...]:
    """Every *.so.<version> in the driver's folders and their vdpau/, the legacy NVVM, and with
    `explicit` the EXPLICIT_LIBRARIES: what the update-ldcache and create-symlinks hooks cover."""
    folders = [*lib_dirs, *(posixpath.join(d, "vdpau") for d in lib_dirs)]
    found = tree.resolved(folders, f"*.so.{version}")
    found += tree.resolved(lib_dirs, NVVM_LEGACY)
    if explicit:
        for name in EXPLICIT_LIBRARIES:
            found += tree.resolved(lib_dirs, name)
    return tuple(_library(tree, target_root, p) for p in _unique(found))


def graphics(tree: Tree, target_root: str, lib_dirs: tuple[str, ...], version: str,
             warnings: list[str]) -> tuple[Library, ...]:
    """EGL/Wayland/GBM libraries anywhere a library is looked for, then the first of each Xorg module."""
    found: list[str] = []
    for pattern in GRAPHICS_LIBRARIES:
        try:
            found += tree.libraries(pattern.format(version=version))
        except CdiError as err:  # an optional library and a corrupt ld.so.cache: leave it out
            warnings.append(str(err))
    per_lib_dir = ("nvidia/xorg", *(f"xorg/{s}" for s in XORG_SUBDIRS))
    xorg_dirs = [posixpath.join(d, sub) for d in lib_dirs for sub in per_lib_dir]
    xorg_dirs += [posixpath.join(r, s) for r in XORG_ROOTS for s in XORG_SUBDIRS]
    for name in XORG_FILES:
        found += tree.matches(xorg_dirs, name.format(version=version), count=1)
    return tuple(_library(tree, target_root, p) for p in _unique(found))


def configs(tree: Tree, target_root: str, environ: Mapping[str, str], machine: str) -> tuple[HostFile, ...]:
    """Driver configs under /etc and the data folders, each where found; Vulkan's under /etc."""
    data_dirs = [d for d in environ.get("XDG_DATA_DIRS", "").split(":") if d] or list(DATA_DIRS)
    dirs = [*CONFIG_DIRS, *data_dirs]
    files = [_file(target_root, p) for name in CONFIG_FILES for p in tree.matches(dirs, name)]
    vulkan = list(VULKAN_FILES)
    if machine in VULKAN_ARCH_FILES:
        vulkan.append(VULKAN_ARCH_FILES[machine])
    for name in vulkan:
        hits = tree.matches(dirs, name) or tree.matches(["/"], name)
        if hits:
            files.append(_file(target_root, hits[0], posixpath.join("/etc", name)))
    return tuple(dict.fromkeys(files))


def firmware(tree: Tree, target_root: str, version: str, custom_dir: str | None,
             release: str) -> tuple[HostFile, ...]:
    """The GSP firmware of this driver version, in the kernel's firmware search order."""
    dirs = [d.format(release=release) for d in FIRMWARE_DIRS]
    if custom_dir:
        dirs.insert(0, custom_dir)
    found = tree.matches(dirs, f"nvidia/{version}/gsp*.bin")
    return tuple(_file(target_root, p) for p in _unique(found))


def binaries(tree: Tree, target_root: str, search_path: str) -> tuple[HostFile, ...]:
    return tuple(_file(target_root, p) for p in tree.executables(BINARIES, search_path))


def ipc(tree: Tree, target_root: str) -> tuple[HostFile, ...]:
    """The persistenced and fabric manager sockets (the first of /run, /var/run) and the MPS pipe."""
    found = [p for name in IPC_SOCKETS for p in tree.matches(IPC_DIRS, name, count=1)]
    found += tree.matches(["/"], MPS_PIPE, count=1)
    return tuple(_file(target_root, p) for p in _unique(found))


def symlinks_by_dir(tree: Tree, libs: Iterable[Library]) -> dict[str, frozenset[str]]:
    """For each folder holding one of `libs`, the names there that are symlinks on the host."""
    out: dict[str, frozenset[str]] = {}
    for folder in _unique(posixpath.dirname(lib.path) for lib in libs):
        try:
            with os.scandir(tree.full(folder)) as entries:
                out[folder] = frozenset(e.name for e in entries if e.is_symlink())
        except OSError:
            out[folder] = frozenset()
    return out
