"""The pieces of container edits: hooks, GIDs, the simplify pass, library links and hook-less mounts."""

from __future__ import annotations

from nvdp.cdi.edits import HookMaker, additional_gid, tidy, without_common
from nvdp.cdi.facts import Library, Node
from nvdp.cdi.links import graphics_links, hookless_mounts, library_links, so_link
from nvdp.cdi.spec import ContainerEdits, DeviceNode, Mount

LIB = "/usr/lib64"


def test_hook_forms() -> None:
    ctk = HookMaker("/usr/bin/nvidia-ctk")
    (hook,) = ctk.make("update-ldcache", ["/a", "/b"])
    assert hook.args == ("nvidia-ctk", "hook", "update-ldcache", "--folder", "/a", "--folder", "/b")
    (hook,) = HookMaker("/opt/bin/nvidia-cdi-hook").make("create-symlinks", ["x::/y"])
    assert hook.args == ("nvidia-cdi-hook", "create-symlinks", "--link", "x::/y")
    assert (hook.hook_name, hook.env) == ("createContainer", ("NVIDIA_CTK_DEBUG=false",))
    assert ctk.make("create-symlinks", []) == ()  # no links: no hook
    assert ctk.make("chmod", ["/dev/dri"]) == ()  # off by default, as in NVIDIA's toolkit
    assert HookMaker("/usr/bin/nvidia-ctk", ["enable-cuda-compat"]).make("enable-cuda-compat") == ()
    assert HookMaker("/usr/bin/nvidia-ctk", ["all"]).make("update-application-profile") == ()


def test_additional_gid_only_for_group_owned_nodes_not_world_rw() -> None:
    assert additional_gid(Node("/dev/a", "/dev/a", mode=0o660, gid=44)) == 44
    assert additional_gid(Node("/dev/a", "/dev/a", mode=0o664, gid=44)) == 44  # world-readable only
    assert additional_gid(Node("/dev/a", "/dev/a", mode=0o666, gid=44)) is None
    assert additional_gid(Node("/dev/a", "/dev/a", mode=0o660, gid=0)) is None
    assert additional_gid(Node("/dev/a", mode=None, gid=44)) is None  # mode unknown


def test_tidy_dedupes_and_sorts_by_depth_then_path() -> None:
    paths = ("/dev/dri/card1", "/dev/nvidia1", "/dev/nvidia0", "/dev/nvidia1")
    nodes = tuple(DeviceNode(path=p) for p in paths)
    lib = Mount(host_path="/a", container_path="/usr/lib/x/libz.so")
    mounts = (lib, Mount(host_path="/b", container_path="/b/c"), lib)
    edits = tidy(ContainerEdits(env=("B=1", "A=1", "B=1"), device_nodes=nodes, mounts=mounts,
                                additional_gids=(993, 44, 993)))
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/dri/card1"]
    assert [m.container_path for m in edits.mounts] == ["/b/c", "/usr/lib/x/libz.so"]
    assert edits.env == ("B=1", "A=1")  # order kept
    assert edits.additional_gids == (44, 993)


def test_without_common_removes_what_the_common_edits_give_unless_nothing_is_left() -> None:
    common = ContainerEdits(device_nodes=(DeviceNode(path="/dev/nvidiactl"),))
    device = ContainerEdits(device_nodes=(DeviceNode(path="/dev/nvidiactl"), DeviceNode(path="/dev/nvidia0")))
    assert without_common(device, common).device_nodes == (DeviceNode(path="/dev/nvidia0"),)
    only_common = ContainerEdits(device_nodes=(DeviceNode(path="/dev/nvidiactl"),))
    assert without_common(only_common, common) == only_common


def test_so_link() -> None:
    assert so_link("libcuda.so.1") == "libcuda.so"
    assert so_link("libnvidia-ml.so.550.54.15") == "libnvidia-ml.so"
    assert so_link("libfoo.so") == "libfoo.so"
    assert so_link("nvidia-smi") == ""


def test_library_links_need_the_hosts_symlinks() -> None:
    libs = [Library(f"{LIB}/libcuda.so.550.54.15", "/h", "libcuda.so.1"),
            Library(f"{LIB}/libnvidia-ml.so.550.54.15", "/h", "libnvidia-ml.so.1"),
            Library(f"{LIB}/libGLX_nvidia.so.550.54.15", "/h", None),
            Library(f"{LIB}/libnvidia-opticalflow.so.550.54.15", "/h", None),
            Library(f"{LIB}/libnvidia-tls.so.550.54.15", "/h", "libnvidia-tls.so.550.54.15")]
    links = library_links(libs, {LIB: frozenset({"libcuda.so.1", "libcuda.so", "libnvidia-ml.so"})})
    assert links == [
        f"libcuda.so.1::{LIB}/libcuda.so",
        f"libcuda.so.550.54.15::{LIB}/libcuda.so.1",
        # no libnvidia-ml.so.1 link on the host: no SONAME link; its .so link is there, so that one is made
        f"libnvidia-ml.so.1::{LIB}/libnvidia-ml.so",
        f"libGLX_nvidia.so.550.54.15::{LIB}/libGLX_indirect.so.0",
        f"libnvidia-opticalflow.so.1::{LIB}/libnvidia-opticalflow.so",
    ]


def test_graphics_links() -> None:
    libs = [Library(f"{LIB}/libnvidia-allocator.so.550.54.15", "/h"),
            Library(f"{LIB}/libnvidia-vulkan-producer.so.550.54.15", "/h"),
            Library("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15", "/h"),
            Library(f"{LIB}/libnvidia-egl-gbm.so.1.1.2", "/h")]
    assert graphics_links(libs, "550.54.15") == [
        f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so",
        f"libnvidia-vulkan-producer.so.550.54.15::{LIB}/libnvidia-vulkan-producer.so",
        "libglxserver_nvidia.so.550.54.15::/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
    ]


def test_hookless_mounts_follow_link_chains_to_a_library() -> None:
    cuda = Library(f"{LIB}/libcuda.so.550.54.15", "/host/libcuda.so.550.54.15", "libcuda.so.1")
    allocator = Library(f"{LIB}/libnvidia-allocator.so.550.54.15", "/host/alloc", "libnvidia-allocator.so.1")
    links = [f"libcuda.so.1::{LIB}/libcuda.so", f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so",
             f"libnothing.so.1::{LIB}/libnothing.so"]
    mounts = {m.path: m.host_path for m in hookless_mounts([cuda, allocator], links)}
    assert mounts == {
        f"{LIB}/libcuda.so.1": "/host/libcuda.so.550.54.15",  # SONAME
        f"{LIB}/libnvidia-allocator.so.1": "/host/alloc",
        f"{LIB}/libcuda.so": "/host/libcuda.so.550.54.15",  # libcuda.so -> libcuda.so.1 -> the file
        f"{LIB}/gbm/nvidia-drm_gbm.so": "/host/alloc",
    }
