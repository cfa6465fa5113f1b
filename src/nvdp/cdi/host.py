"""What the host has for CDI: the roots, the hook check, and `discover_host`, the filesystem edge.

`discover_host(config, inventory)` reads the driver tree (under the container driver root), the device
nodes (under the dev root), sysfs and /proc, and returns `HostFacts`, plain data the pure builder
turns into specs. It raises CdiError only when no usable spec can come of it: the driver root is not
a folder, no libcuda.so.<version> is found (the message lists where it looked), the ld.so.cache the
search fell back to is corrupt, or the hook binary is missing on the host. Anything else that is not
there is left out, as NVIDIA leaves it out.
"""

from __future__ import annotations

import os
import platform
import posixpath
from collections.abc import Mapping

from nvdp.cdi import driverfiles, nodes
from nvdp.cdi.errors import CdiError
from nvdp.cdi.facts import GatedFiles, HostFacts, HostFile, Library, Node, Roots, gated_modes, sysfs_bus_id
from nvdp.cdi.locate import Tree, is_executable
from nvdp.config.model import Config
from nvdp.inventory.model import Inventory

__all__ = [
    "GatedFiles", "HostFacts", "HostFile", "Library", "Node", "Roots", "check_hook", "discover_host",
    "resolve_roots",
]  # fmt: skip

# The chart mounts the hook's host file here under its base name (read-only, the file alone), so the
# plugin can see that the hook exists.
HOST_HOOK_DIR_ENV = "NVDP_HOST_HOOK_DIR"
# Where the host's /sys is; the stand-in node points it elsewhere (nvdp.inventory.nvml.SYSFS_ROOT_ENV).
SYSFS_ROOT_ENV = "NVDP_SYSFS_ROOT"
# Where the host's /proc is for the MIG capability files; the stand-in images point it at a tree of theirs.
PROC_ROOT_ENV = "NVDP_PROC_ROOT"
FIRMWARE_PATH_PARAMETER = "module/firmware_class/parameters/path"
# The hooks a gpu spec can hold; when all are disabled the hook binary is not needed.
HOOK_NAMES = ("create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification",
              "update-application-profile")
FIX_DRIVER_ROOT = (
    "set nvidiaDriverRoot (--driver-root / NVIDIA_DRIVER_ROOT) to where the driver is installed on the "
    "host, e.g. /run/nvidia/driver under the GPU Operator, so the chart mounts it at the container driver "
    "root (plugin.containerDriverRoot, /driver-root)"
)


def resolve_roots(config: Config, dev_root: str | None = None) -> Roots:
    """The four roots by NVIDIA's rules; the container driver root falls back to / when it is absent
    (the driver then comes into the plugin's own / through the container runtime). `dev_root`: where
    the device nodes are read, when not by the plugin's rule (the driver root's dev/, else /): on a
    host, nvidia-ctk reads them under its --dev-root."""
    configured = config.flags.plugin.container_driver_root or "/"
    driver_root = configured
    if not os.path.exists(configured):
        driver_root = "/"
    elif not os.path.isdir(configured):
        raise CdiError(f"the container driver root {configured} is not a folder; {FIX_DRIVER_ROOT}")
    if dev_root is None:
        dev_root = driver_root if os.path.isdir(posixpath.join(driver_root, "dev")) else "/"
    return Roots(
        driver_root=driver_root,
        target_driver_root=config.flags.nvidia_driver_root or "/",
        dev_root=dev_root,
        target_dev_root=config.flags.dev_root or "/",
    )


def disabled_hooks(config: Config) -> frozenset[str]:
    return frozenset(config.flags.plugin.cdi_disable_hooks)


def hooks_needed(config: Config) -> bool:
    disabled = disabled_hooks(config)
    return "all" not in disabled and not disabled.issuperset(HOOK_NAMES)


def check_hook(config: Config, roots: Roots, environ: Mapping[str, str]) -> None:
    """Refuse specs whose hook binary the host does not have (a container would fail to start with
    "fork/exec ...: no such file" long after). The hook runs on the host, so it is looked for as the
    host sees it: in $NVDP_HOST_HOOK_DIR (the chart mounts the file there), else under the
    container driver root when that is the host's /, else at the path itself."""
    if not hooks_needed(config):
        return
    hook = config.flags.plugin.nvidia_ctk_path
    fix = (
        "Set cdi.nvidiaHookPath (--nvidia-cdi-hook-path / NVIDIA_CDI_HOOK_PATH) to the host path of "
        "nvidia-cdi-hook or nvidia-ctk (e.g. /usr/local/nvidia/toolkit/nvidia-cdi-hook under the GPU "
        "Operator, /usr/bin/nvidia-ctk for a host install of the NVIDIA Container Toolkit), or write "
        "specs without hooks: flags.plugin.cdiDisableHooks: [all] in the config file (with the chart: "
        "config.map), or --cdi-disable-hooks=all / CDI_DISABLE_HOOKS=all (see docs/cdi.md for their "
        "limits)"
    )
    if not hook.startswith("/"):
        raise CdiError(f"the CDI hook path {hook!r} is not absolute; the runtime runs it on the host. {fix}")
    host_dir = environ.get(HOST_HOOK_DIR_ENV)
    if host_dir:
        looked, how = posixpath.join(host_dir, posixpath.basename(hook)), f"${HOST_HOOK_DIR_ENV}"
    elif roots.target_driver_root == "/":
        looked, how = posixpath.join(roots.driver_root, hook.lstrip("/")), "the container driver root"
    else:
        looked, how = hook, "the plugin's own file system"
    if is_executable(looked):
        return
    state = "is not an executable file" if os.path.lexists(looked) else "does not exist"
    raise CdiError(f"the CDI hook {hook} was looked for at {looked} (through {how}) and {state}. {fix}")


def discover_host(config: Config, inventory: Inventory, *, sysfs_root: str | None = None,
                  proc_root: str | None = None, environ: Mapping[str, str] | None = None,
                  dev_root: str | None = None) -> HostFacts:
    """Everything the specs need from this node, for the GPUs of `inventory`.

    `sysfs_root` and `proc_root` let tests point at a tree of their own (default: $NVDP_SYSFS_ROOT or
    /sys, and $NVDP_PROC_ROOT or /proc: the stand-in node's MIG capability files); `environ` defaults
    to the process's; `dev_root`: see `resolve_roots`.
    """
    env = os.environ if environ is None else environ
    sysfs = sysfs_root if sysfs_root is not None else env.get(SYSFS_ROOT_ENV, "/sys")
    proc_root = proc_root if proc_root is not None else env.get(PROC_ROOT_ENV, "/proc")
    roots = resolve_roots(config, dev_root)
    tree = Tree(roots.driver_root)
    target = roots.target_driver_root
    version = inventory.driver_version or driverfiles.version_from_files(tree)
    lib_dirs = driverfiles.libcuda_dirs(tree, version) if version else ()
    if not version or not lib_dirs:
        searched = ", ".join(dict.fromkeys(tree.searched))
        wanted = f"libcuda.so.{version}" if version else "libcuda.so.<version>"
        raise CdiError(f"no {wanted} under the container driver root {roots.driver_root} (looked in "
                       f"{searched}): the CDI spec cannot name the driver's libraries; {FIX_DRIVER_ROOT}")
    check_hook(config, roots, env)
    warnings: list[str] = []
    flags = frozenset(config.flags.plugin.cdi_feature_flags)
    explicit = "enable-explicit-driver-libraries" in flags
    libraries = driverfiles.libraries(tree, target, lib_dirs, version, explicit)
    graphics = driverfiles.graphics(tree, target, lib_dirs, version, warnings)
    control = nodes.control_nodes(roots)
    if not any(n.path == "/dev/nvidiactl" for n in control):
        warnings.append(f"no /dev/nvidiactl under the dev root {roots.dev_root}: containers cannot use "
                        "the GPUs without it")
    drm = {bus: nodes.drm(roots, bus, sysfs) for bus in dict.fromkeys(sysfs_bus_id(g.pci_bus_id)
                                                                          for g in inventory.gpus)}
    return HostFacts(
        roots=roots,
        driver_version=version,
        lib_dirs=lib_dirs,
        libraries=libraries,
        graphics=graphics,
        configs=driverfiles.configs(tree, target, env, platform.machine()),
        firmware=driverfiles.firmware(tree, target, version, _firmware_dir(sysfs), platform.release()),
        binaries=driverfiles.binaries(tree, target, env.get("PATH", "")),
        ipc=() if "disable-ipc-discoverer" in flags else driverfiles.ipc(tree, target),
        symlinks=driverfiles.symlinks_by_dir(tree, (*libraries, *graphics)),
        control_nodes=control,
        gpu_nodes=nodes.gpu_nodes(roots, inventory),
        drm_nodes={bus: found for bus, (found, _) in drm.items() if found},
        drm_links={bus: links for bus, (_, links) in drm.items() if links},
        mig_caps=nodes.mig_caps(roots, inventory, proc_root, warnings,
                                made_on_demand=config.flags.mig_strategy == "dynamic"),
        imex_channels=nodes.imex_channels(roots, config.imex.channel_ids),
        gated=nodes.gated(roots, tree, target, gated_modes(config)),
        warnings=tuple(warnings),
    )


def _firmware_dir(sysfs_root: str) -> str | None:
    """The kernel's custom firmware folder, when one is set (searched first, as the kernel does)."""
    try:
        with open(posixpath.join(sysfs_root, FIRMWARE_PATH_PARAMETER), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None
