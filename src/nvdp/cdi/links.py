"""The symlinks a container needs next to the driver's libraries, and their hook-less stand-ins.

Pure. With hooks, NVIDIA's `create-symlinks` hook makes them in the container (each `<target>::<link>`);
the rules are NVIDIA's toolkit's (internal/discover/symlinks.go, graphics.go). With every hook
disabled (`--cdi-disable-hooks=all`) nothing runs in the container, so nvdp mounts the library itself
at each such path instead, and at every library's SONAME, so the loader finds it without ldconfig.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from nvdp.cdi.facts import HostFile, Library

MAX_HOPS = 8


def so_link(name: str) -> str:
    """The development link a SONAME is reached by: `libcuda.so.1` -> `libcuda.so`; "" when the name
    has no `.so` part."""
    stem, ext = posixpath.splitext(name)
    if not ext:
        return ""
    return name if ext == ".so" else so_link(stem)


def library_links(libs: Iterable[Library], symlinks: Mapping[str, frozenset[str]]) -> list[str]:
    """The create-symlinks links for the driver's libraries, in NVIDIA's order, each once:

    - `libcuda.so` -> `libcuda.so.1` (applications dlopen the former), `libGLX_indirect.so.0` ->
      `libGLX_nvidia.so.<v>` (GLVND's indirect GLX), `libnvidia-opticalflow.so` -> `.so.1`;
    - for a file named `x.y.z` with a SONAME: `<SONAME>` -> the file, and `<name>.so` -> `<SONAME>`,
      each only where the host's folder has that symlink too.
    """
    links: list[str] = []
    for lib in libs:
        folder, name = posixpath.split(lib.path)
        if fnmatchcase(name, "libcuda.so.*.*"):
            links.append(f"libcuda.so.1::{folder}/libcuda.so")
        elif fnmatchcase(name, "libGLX_nvidia.so.*.*"):
            links.append(f"{name}::{folder}/libGLX_indirect.so.0")
        elif fnmatchcase(name, "libnvidia-opticalflow.so.*.*"):
            links.append(f"libnvidia-opticalflow.so.1::{folder}/libnvidia-opticalflow.so")
        if lib.soname is None or not fnmatchcase(name, "*.*.*"):
            continue
        on_host = symlinks.get(folder, frozenset())
        if lib.soname != name and lib.soname in on_host:
            links.append(f"{name}::{folder}/{lib.soname}")
        dev = so_link(lib.soname)
        if dev and dev != lib.soname and dev in on_host:
            links.append(f"{lib.soname}::{folder}/{dev}")
    return list(dict.fromkeys(links))


def graphics_links(libs: Iterable[Library], version: str) -> list[str]:
    """The links GBM, Vulkan and Xorg look for: `gbm/nvidia-drm_gbm.so` -> the allocator's SONAME link,
    and the unversioned `.so` of the Vulkan producer and the GLX server module."""
    links = []
    for lib in libs:
        folder, name = posixpath.split(lib.path)
        if name == f"libnvidia-allocator.so.{version}":
            links.append(f"../libnvidia-allocator.so.1::{folder}/gbm/nvidia-drm_gbm.so")
        elif name in (f"libnvidia-vulkan-producer.so.{version}", f"libglxserver_nvidia.so.{version}"):
            links.append(f"{name}::{folder}/{name.split('.so.')[0]}.so")
    return links


def hookless_mounts(libs: Iterable[Library], links: Iterable[str]) -> list[HostFile]:
    """What replaces the links without hooks: each library's file also at `<folder>/<SONAME>`, and the
    file each link resolves to at the link's path (a link that resolves to no library is left out)."""
    libraries = list(libs)
    by_path = {lib.path: lib for lib in libraries}
    aliases = {posixpath.join(posixpath.dirname(lib.path), lib.soname): lib
               for lib in libraries if lib.soname and lib.soname != posixpath.basename(lib.path)}
    targets: dict[str, str] = {}
    for link in links:
        target, _, path = link.partition("::")
        targets[path] = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    out = [HostFile(path, lib.host_path) for path, lib in aliases.items()]
    for path in targets:
        lib = _resolve(path, by_path, aliases, targets)
        if lib is not None and path != lib.path:
            out.append(HostFile(path, lib.host_path))
    return list({m.path: m for m in out}.values())


def _resolve(path: str, by_path: Mapping[str, Library], aliases: Mapping[str, Library],
             targets: Mapping[str, str]) -> Library | None:
    for _ in range(MAX_HOPS):
        if path in by_path:
            return by_path[path]
        if path in aliases:
            return aliases[path]
        if path not in targets:
            return None
        path = targets[path]
    return None
