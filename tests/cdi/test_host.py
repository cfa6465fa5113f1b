"""Host discovery on fake trees: roots, the driver's files, the hook check, the errors that stop a spec.

Device nodes need mknod, so their tests run as root only (test_nodes.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nvdp.cdi.errors import CdiError
from nvdp.cdi.host import HOST_HOOK_DIR_ENV, check_hook, discover_host, resolve_roots
from nvdp.cdi.locate import Tree
from nvdp.config.model import Config, Flags, PluginFlags
from nvdp.inventory.model import Inventory
from tests.cdi.test_ldcache import X86_64, new_format
from tests.cdi.trees import elf_library, link, needs_gcc, touch

VERSION = "550.54.15"
LIB = "usr/lib/x86_64-linux-gnu"


def config(root: Path | str, *, driver_root: str = "/", dev_root: str = "", hook: str = "/usr/bin/nvidia-ctk",
           **plugin: Any) -> Config:
    flags = PluginFlags(container_driver_root=str(root), nvidia_ctk_path=hook, **plugin)
    return Config(flags=Flags(nvidia_driver_root=driver_root, nvidia_dev_root=dev_root, plugin=flags))


def inventory(version: str = VERSION) -> Inventory:
    return Inventory(driver_version=version, cuda_driver_version="12.4")


def driver_tree(root: Path) -> Path:
    """A small driver install: libcuda and friends, vdpau, nvvm70, the hook."""
    touch(root / LIB / f"libcuda.so.{VERSION}")
    link(root / LIB / "libcuda.so.1", f"libcuda.so.{VERSION}")
    touch(root / LIB / f"libnvidia-ml.so.{VERSION}")
    touch(root / LIB / "vdpau" / f"libvdpau_nvidia.so.{VERSION}")
    touch(root / LIB / "libnvidia-nvvm70.so.4")
    touch(root / LIB / "libnvidia-ml.so.1.2")  # another version: not the driver's
    touch(root / "usr/bin/nvidia-ctk", 0o755)
    return root


def discover(root: Path, cfg: Config | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("sysfs_root", str(root.parent / "sys"))
    kwargs.setdefault("proc_root", str(root.parent / "proc"))
    kwargs.setdefault("environ", {"PATH": "/usr/bin:/bin"})
    return discover_host(cfg or config(root), inventory(), **kwargs)


# --- roots -------------------------------------------------------------------------------------------


def test_roots_follow_nvidias_rules(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    roots = resolve_roots(config(tmp_path, driver_root="/run/nvidia/driver"))
    assert (roots.driver_root, roots.target_driver_root) == (str(tmp_path), "/run/nvidia/driver")
    assert (roots.dev_root, roots.target_dev_root) == (str(tmp_path), "/run/nvidia/driver")
    roots = resolve_roots(config(tmp_path, driver_root="/run/nvidia/driver", dev_root="/"))
    assert roots.target_dev_root == "/"


def test_a_driver_root_without_dev_uses_the_plugins_dev(tmp_path: Path) -> None:
    assert resolve_roots(config(tmp_path)).dev_root == "/"


def test_a_missing_container_driver_root_falls_back_to_slash(tmp_path: Path) -> None:
    roots = resolve_roots(config(tmp_path / "driver-root"))
    assert (roots.driver_root, roots.dev_root) == ("/", "/")


def test_a_driver_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    touch(tmp_path / "driver-root")
    with pytest.raises(CdiError, match=r"driver root .*/driver-root is not a folder; set nvidiaDriverRoot"):
        resolve_roots(config(tmp_path / "driver-root"))


# --- libraries ---------------------------------------------------------------------------------------


def test_libraries_of_the_driver_version(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    facts = discover(root)
    assert facts.lib_dirs == (f"/{LIB}",)
    assert [lib.path for lib in facts.libraries] == [
        f"/{LIB}/libcuda.so.{VERSION}", f"/{LIB}/libnvidia-ml.so.{VERSION}",
        f"/{LIB}/vdpau/libvdpau_nvidia.so.{VERSION}", f"/{LIB}/libnvidia-nvvm70.so.4",
    ]
    assert facts.libraries[0].host_path == f"/{LIB}/libcuda.so.{VERSION}"
    assert facts.symlinks[f"/{LIB}"] == {"libcuda.so.1"}


def test_host_paths_carry_the_target_driver_root(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    facts = discover(root, config(root, driver_root="/run/nvidia/driver", cdi_disable_hooks=("all",)))
    assert facts.libraries[0].host_path == f"/run/nvidia/driver/{LIB}/libcuda.so.{VERSION}"
    assert facts.libraries[0].path == f"/{LIB}/libcuda.so.{VERSION}"


def test_an_absolute_symlink_resolves_inside_the_driver_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    touch(root / "opt/nvidia" / f"libcuda.so.{VERSION}")
    # An absolute target, as the host's own install writes it.
    link(root / LIB / f"libcuda.so.{VERSION}", f"/opt/nvidia/libcuda.so.{VERSION}")
    touch(root / "usr/bin/nvidia-ctk", 0o755)
    facts = discover(root)
    assert facts.lib_dirs == ("/opt/nvidia",)
    assert facts.libraries[0].path == f"/opt/nvidia/libcuda.so.{VERSION}"


def test_no_libcuda_lists_where_it_looked_and_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "root"
    touch(root / LIB / f"libnvidia-ml.so.{VERSION}")
    with pytest.raises(CdiError) as caught:
        discover(root)
    message = str(caught.value)
    assert f"no libcuda.so.{VERSION} under the container driver root {root}" in message
    assert f"{root}/usr/lib64/libcuda.so.{VERSION}" in message
    assert f"{root}/etc/ld.so.cache" in message
    assert "set nvidiaDriverRoot (--driver-root / NVIDIA_DRIVER_ROOT)" in message
    assert "/run/nvidia/driver under the GPU Operator" in message


def test_the_ld_so_cache_finds_a_driver_outside_the_standard_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    touch(root / "opt/nvidia/lib" / f"libcuda.so.{VERSION}")
    touch(root / "usr/bin/nvidia-ctk", 0o755)
    touch(root / "etc/ld.so.cache", data=new_format([
        (X86_64, f"libcuda.so.{VERSION}", f"/opt/nvidia/lib/libcuda.so.{VERSION}"),
    ]))
    facts = discover(root)
    assert facts.lib_dirs == ("/opt/nvidia/lib",)
    assert [lib.path for lib in facts.libraries] == [f"/opt/nvidia/lib/libcuda.so.{VERSION}"]


def test_a_corrupt_ld_so_cache_with_nothing_globbed_is_named(tmp_path: Path) -> None:
    root = tmp_path / "root"
    touch(root / "etc/ld.so.cache", data=b"glibc-ld.so.cache1.1" + b"\xff" * 40)
    with pytest.raises(CdiError, match=rf"{root}/etc/ld.so.cache is not a readable ld.so.cache .*ldconfig"):
        discover(root)


def test_a_corrupt_ld_so_cache_is_not_read_when_the_glob_finds_the_driver(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / "etc/ld.so.cache", data=b"garbage")
    assert discover(root).lib_dirs == (f"/{LIB}",)


def test_the_version_falls_back_to_libcudas_suffix(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    facts = discover_host(config(root), inventory(version=""), sysfs_root=str(tmp_path),
                          proc_root=str(tmp_path))
    assert facts.driver_version == VERSION


@needs_gcc
def test_sonames_are_read(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    os.unlink(root / LIB / f"libcuda.so.{VERSION}")
    elf_library(root / LIB / f"libcuda.so.{VERSION}", "libcuda.so.1")
    sonames = {lib.path.rsplit("/", 1)[1]: lib.soname for lib in discover(root).libraries}
    assert sonames[f"libcuda.so.{VERSION}"] == "libcuda.so.1"
    assert sonames[f"libnvidia-ml.so.{VERSION}"] is None  # an empty file: no SONAME links for it


# --- other driver files ------------------------------------------------------------------------------


def test_binaries_first_hit_in_path_order_and_executable_only(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / "usr/local/bin/nvidia-smi", 0o755)
    touch(root / "usr/bin/nvidia-smi", 0o755)
    touch(root / "usr/bin/nvidia-debugdump", 0o644)  # not executable
    facts = discover(root, environ={"PATH": "/usr/bin"})
    assert [b.path for b in facts.binaries] == ["/usr/bin/nvidia-smi"]
    facts = discover(root, environ={"PATH": ""})
    assert [b.path for b in facts.binaries] == ["/usr/local/bin/nvidia-smi"]  # the default path's order


def test_firmware_in_the_kernels_search_order(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin")
    touch(root / f"opt/fw/nvidia/{VERSION}/gsp_tu10x.bin")
    touch(root / "lib/firmware/nvidia/1.2.3/gsp_ga10x.bin")  # another driver's
    touch(tmp_path / "sys/module/firmware_class/parameters/path", data=b"/opt/fw\n")
    facts = discover(root)
    assert [f.path for f in facts.firmware] == [f"/opt/fw/nvidia/{VERSION}/gsp_tu10x.bin",
                                                f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"]


def test_ipc_sockets_and_the_mps_folder(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / "run/nvidia-persistenced/socket")
    touch(root / "var/run/nvidia-persistenced/socket")
    touch(root / "var/run/nvidia-fabricmanager/socket")
    (root / "tmp/nvidia-mps").mkdir(parents=True)  # a folder: NVIDIA's file lookup never takes it
    facts = discover(root)
    assert [f.path for f in facts.ipc] == ["/run/nvidia-persistenced/socket",
                                           "/var/run/nvidia-fabricmanager/socket"]


def test_disable_ipc_discoverer(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / "run/nvidia-persistenced/socket")
    assert discover(root, config(root, cdi_feature_flags=("disable-ipc-discoverer",))).ipc == ()


def test_configs_and_vulkan_files(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / "etc/glvnd/egl_vendor.d/10_nvidia.json")
    touch(root / "usr/share/glvnd/egl_vendor.d/10_nvidia.json")  # both: both mounted, as NVIDIA does
    touch(root / "usr/share/vulkan/icd.d/nvidia_icd.json")
    touch(root / "vulkan/implicit_layer.d/nvidia_layers.json")  # GKE keeps it at the root
    facts = discover(root)
    assert [(f.path, f.host_path) for f in facts.configs] == [
        ("/etc/glvnd/egl_vendor.d/10_nvidia.json", "/etc/glvnd/egl_vendor.d/10_nvidia.json"),
        ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
        ("/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json"),
        ("/etc/vulkan/implicit_layer.d/nvidia_layers.json", "/vulkan/implicit_layer.d/nvidia_layers.json"),
    ]


def test_graphics_libraries_and_the_first_xorg_module(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    touch(root / LIB / "libnvidia-egl-gbm.so.1.1.2")
    touch(root / LIB / "nvidia/xorg/nvidia_drv.so")
    touch(root / "usr/lib/xorg/modules/drivers/nvidia_drv.so")  # after the driver folder's own
    facts = discover(root)
    assert [g.path for g in facts.graphics] == [f"/{LIB}/libnvidia-egl-gbm.so.1.1.2",
                                                f"/{LIB}/nvidia/xorg/nvidia_drv.so"]


def test_locate_resolves_relative_links_and_dot_dot(tmp_path: Path) -> None:
    tree = Tree(str(tmp_path))
    touch(tmp_path / "a/b/file")
    link(tmp_path / "a/c", "b/../b")
    link(tmp_path / "x", "/a/c/file")
    assert tree.resolve("/x") == "/a/b/file"
    link(tmp_path / "loop", "loop")
    assert tree.resolve("/loop") is None
    assert tree.resolve("/missing") is None


# --- the hook check ----------------------------------------------------------------------------------


def test_the_hook_is_looked_for_under_the_driver_root_when_the_host_is_slash(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    cfg = config(root)
    check_hook(cfg, resolve_roots(cfg), {})
    os.unlink(root / "usr/bin/nvidia-ctk")
    with pytest.raises(CdiError) as caught:
        check_hook(cfg, resolve_roots(cfg), {})
    message = str(caught.value)
    assert f"looked for at {root}/usr/bin/nvidia-ctk (through the container driver root)" in message
    assert "does not exist" in message
    assert "cdi.nvidiaHookPath (--nvidia-cdi-hook-path / NVIDIA_CDI_HOOK_PATH)" in message
    assert "/usr/local/nvidia/toolkit/nvidia-cdi-hook" in message and "--cdi-disable-hooks=all" in message


def test_the_hook_is_looked_for_in_the_mounted_host_folder(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    cfg = config(root, hook="/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    env = {HOST_HOOK_DIR_ENV: str(tmp_path / "hookdir")}
    looked = rf"at {tmp_path}/hookdir/nvidia-cdi-hook \(through \$NVDP_HOST_HOOK_DIR\)"
    with pytest.raises(CdiError, match=looked):
        check_hook(cfg, resolve_roots(cfg), env)
    touch(tmp_path / "hookdir/nvidia-cdi-hook", 0o644)
    with pytest.raises(CdiError, match="is not an executable file"):
        check_hook(cfg, resolve_roots(cfg), env)
    os.chmod(tmp_path / "hookdir/nvidia-cdi-hook", 0o755)
    check_hook(cfg, resolve_roots(cfg), env)


def test_the_hook_is_looked_for_at_its_path_when_the_driver_root_is_elsewhere(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    hook = tmp_path / "bin/nvidia-cdi-hook"
    cfg = config(root, driver_root="/run/nvidia/driver", hook=str(hook))
    with pytest.raises(CdiError, match="through the plugin's own file system"):
        check_hook(cfg, resolve_roots(cfg), {})
    touch(hook, 0o755)
    check_hook(cfg, resolve_roots(cfg), {})


def test_the_hook_is_not_needed_when_every_hook_is_disabled(tmp_path: Path) -> None:
    root = driver_tree(tmp_path / "root")
    os.unlink(root / "usr/bin/nvidia-ctk")
    everything = ("create-symlinks", "enable-cuda-compat", "update-ldcache",
                  "disable-device-node-modification", "update-application-profile")
    for disabled in (("all",), everything):
        cfg = config(root, cdi_disable_hooks=disabled)
        check_hook(cfg, resolve_roots(cfg), {})
    cfg = config(root, cdi_disable_hooks=everything[1:])
    with pytest.raises(CdiError):
        check_hook(cfg, resolve_roots(cfg), {})


def test_a_relative_hook_path_is_refused(tmp_path: Path) -> None:
    cfg = config(driver_tree(tmp_path / "root"), hook="nvidia-ctk")
    with pytest.raises(CdiError, match="is not absolute"):
        check_hook(cfg, resolve_roots(cfg), {})


# --- the package's entry points ----------------------------------------------------------------------


def test_cdi_enabled_by_a_cdi_strategy() -> None:
    from nvdp.cdi import cdi_enabled

    for strategies, enabled in ((("envvar",), False), (("cdi-cri",), True),
                                (("envvar", "cdi-annotations"), True), (("volume-mounts",), False)):
        flags = Flags(plugin=PluginFlags(device_list_strategy=strategies))  # type: ignore[arg-type]
        assert cdi_enabled(Config(flags=flags)) is enabled


def test_generate_logs_what_discovery_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.cdi import generate
    from nvdp.plan.model import Plan

    root = driver_tree(tmp_path / "root")
    (root / "dev").mkdir()  # a dev root without nvidiactl
    with caplog.at_level("WARNING", logger="nvdp.cdi"):
        specs = generate(config(root), inventory(), Plan())
    assert specs.specs == ()  # no GPU, no gpu spec
    assert f"CDI: no /dev/nvidiactl under the dev root {root}" in caplog.text
