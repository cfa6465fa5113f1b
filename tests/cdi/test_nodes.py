"""Device nodes stat'ed under the dev root (real character devices: root only), sysfs DRM entries and
by-path links, MIG capabilities from /proc, IMEX channels, gated modes."""

from __future__ import annotations

from pathlib import Path

from nvdp.cdi import nodes
from nvdp.cdi.facts import Node, Roots
from nvdp.cdi.locate import Tree
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from tests.cdi.trees import char_device, link, needs_root, touch

pytestmark = needs_root


def roots(tmp_path: Path, target_dev: str = "/") -> Roots:
    return Roots(str(tmp_path), "/", str(tmp_path), target_dev)


def gpu(minor: int, mig: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(index=minor, uuid=f"GPU-{minor}", name="H100", memory_bytes=1, compute_capability=(9, 0),
               minor=minor, pci_bus_id=f"00000000:{minor + 0x18:02X}:00.0", mig_enabled=bool(mig),
               mig_devices=mig)


def mig(parent: int, gi: int, ci: int) -> MigDevice:
    return MigDevice(uuid=f"MIG-{parent}-{gi}-{ci}", index=0, parent_uuid=f"GPU-{parent}",
                     parent_index=parent, profile="1g.10gb", gi_id=gi, ci_id=ci, memory_bytes=1)


def test_nodes_are_stated_and_get_the_target_dev_root(tmp_path: Path) -> None:
    char_device(tmp_path / "dev/nvidia0", 195, 0)
    char_device(tmp_path / "dev/nvidia1", 195, 1, 0o660, 44)
    touch(tmp_path / "dev/nvidia2")  # a file: not a node
    link(tmp_path / "dev/nvidia3", "nvidia0")  # a link: not a node, as NVIDIA's lstat check
    inventory = Inventory(driver_version="1", cuda_driver_version="1", gpus=tuple(gpu(m) for m in range(4)))
    found = nodes.gpu_nodes(roots(tmp_path, "/host"), inventory)
    assert found == {
        0: Node("/dev/nvidia0", "/host/dev/nvidia0", major=195, minor=0, mode=0o666, gid=0),
        1: Node("/dev/nvidia1", "/host/dev/nvidia1", major=195, minor=1, mode=0o660, gid=44),
    }


def test_control_nodes_that_exist(tmp_path: Path) -> None:
    char_device(tmp_path / "dev/nvidiactl", 195, 255)
    char_device(tmp_path / "dev/nvidia-uvm", 235, 0)
    assert [n.path for n in nodes.control_nodes(roots(tmp_path))] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]


def test_drm_nodes_from_sysfs_and_their_by_path_links(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    for entry in ("card1", "renderD128", "controlD64"):
        (sysfs / "bus/pci/devices/0000:18:00.0/drm" / entry).mkdir(parents=True)
    dev = tmp_path / "root/dev"
    char_device(dev / "dri/card1", 226, 1, 0o660, 44)
    char_device(dev / "dri/renderD128", 226, 128)
    link(dev / "dri/by-path/pci-0000:18:00.0-card", "../card1")
    link(dev / "dri/by-path/pci-0000:18:00.0-render", "/dev/dri/renderD128")  # absolute: inside the dev root
    found, links = nodes.drm(roots(tmp_path / "root"), "0000:18:00.0", str(sysfs))
    assert [n.path for n in found] == ["/dev/dri/card1", "/dev/dri/renderD128"]  # no controlD64 node
    assert links == ("../card1::/dev/dri/by-path/pci-0000:18:00.0-card",
                     "/dev/dri/renderD128::/dev/dri/by-path/pci-0000:18:00.0-render")


def test_a_by_path_link_to_another_gpus_node_is_left_out(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    (sysfs / "bus/pci/devices/0000:18:00.0/drm/card1").mkdir(parents=True)
    dev = tmp_path / "root/dev"
    char_device(dev / "dri/card1", 226, 1)
    link(dev / "dri/by-path/pci-0000:18:00.0-card", "../card2")
    assert nodes.drm(roots(tmp_path / "root"), "0000:18:00.0", str(sysfs))[1] == ()


def proc_tree(proc: Path, minors: str | None, capabilities: dict[str, str] | None = None) -> None:
    touch(proc / "devices", data=b"Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n\n"
                                 b"Block devices:\n237 not-this\n")
    if minors is not None:
        touch(proc / "driver/nvidia-caps/mig-minors", data=minors.encode())
    for key, text in (capabilities or {}).items():
        gpu_part, _, rest = key.partition("/")
        touch(proc / "driver/nvidia/capabilities" / gpu_part / "mig" / rest, data=text.encode())


def test_mig_caps_stat_the_host_node_or_describe_it_from_proc(tmp_path: Path) -> None:
    root, proc = tmp_path / "root", tmp_path / "proc"
    proc_tree(proc, "config 1\nmonitor 2\ngpu1/gi1/access 147\ngpu1/gi1/ci0/access 148\n",
              {"gpu1/gi1/ci0/access": "DeviceFileMinor: 148\nDeviceFileMode: 256\nDeviceFileModify: 1\n"})
    char_device(root / "dev/nvidia-caps/nvidia-cap147", 237, 147, 0o400)
    inventory = Inventory(driver_version="1", cuda_driver_version="1", gpus=(gpu(1, (mig(1, 1, 0),)),))
    warnings: list[str] = []
    caps = nodes.mig_caps(roots(root), inventory, str(proc), warnings)
    assert caps == {
        "gpu1/gi1/access": Node("/dev/nvidia-caps/nvidia-cap147", "/dev/nvidia-caps/nvidia-cap147", major=237,
                                minor=147, mode=0o400),
        # no host node: from /proc, for the runtime to create
        "gpu1/gi1/ci0/access": Node("/dev/nvidia-caps/nvidia-cap148", type="c", major=237, minor=148,
                                    mode=256),
    }
    assert warnings == []


def test_made_on_demand_covers_every_instance_mig_minors_lists_for_mig_capable_gpus(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    lines = ["config 1", "monitor 2"] + [
        f"gpu{g}/gi{i}/access {g * 100 + i * 9}" for g in (0, 1) for i in range(1, 15)] + [
        f"gpu{g}/gi{i}/ci{c}/access {g * 100 + i * 9 + c + 1}" for g in (0, 1) for i in range(1, 15)
        for c in range(8)]
    proc_tree(proc, "\n".join(lines) + "\n")
    capable = Gpu(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", memory_bytes=1,
                  compute_capability=(9, 0),
                  minor=0, pci_bus_id="00000000:18:00.0", mig_capable=True)
    inventory = Inventory(driver_version="1", cuda_driver_version="1", gpus=(capable, gpu(1)))
    assert nodes.mig_caps(roots(tmp_path / "root"), inventory, str(proc), []) == {}  # nothing made yet
    caps = nodes.mig_caps(roots(tmp_path / "root"), inventory, str(proc), [], made_on_demand=True)
    assert len(caps) == 14 * 9 and all(key.startswith("gpu0/") for key in caps)  # not GPU 1: not capable
    assert caps["gpu0/gi9/ci0/access"] == Node("/dev/nvidia-caps/nvidia-cap82", type="c", major=237, minor=82)


def test_mig_minors_missing_falls_back_to_the_capability_files(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc_tree(proc, None, {"gpu0/gi7/access": "DeviceFileMinor: 66\nDeviceFileMode: 292\n",
                           "gpu0/gi7/ci0/access": "DeviceFileMinor: 67\nDeviceFileMode: 292\n"})
    gpus = (gpu(0, (mig(0, 7, 0), mig(0, 8, 0))),)
    inventory = Inventory(driver_version="1", cuda_driver_version="1", gpus=gpus)
    warnings: list[str] = []
    caps = nodes.mig_caps(roots(tmp_path / "root"), inventory, str(proc), warnings)
    assert caps == {
        "gpu0/gi7/access": Node("/dev/nvidia-caps/nvidia-cap66", type="c", major=237, minor=66, mode=292),
        "gpu0/gi7/ci0/access": Node("/dev/nvidia-caps/nvidia-cap67", type="c", major=237, minor=67, mode=292),
    }  # gi8 is nowhere: left out, for the builder to name
    assert "mig-minors not read" in warnings[0]


def test_imex_channels_under_the_dev_root_or_at_their_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    char_device(root / "dev/nvidia-caps-imex-channels/channel0", 511, 0)
    touch(root / "dev/nvidia-caps-imex-channels/channel1")  # not a node
    found = nodes.imex_channels(roots(root, "/run/nvidia/driver"), (0, 1, 2))
    assert found == {0: Node("/dev/nvidia-caps-imex-channels/channel0",
                             "/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel0")}


def test_gds_mounts_come_with_its_nodes_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    touch(root / "etc/cufile.json")
    (root / "run/udev").mkdir(parents=True)
    tree = Tree(str(root))
    assert nodes.gated(roots(root), tree, "/", ["gds"]) == {}
    char_device(root / "dev/nvidia-fs0", 240, 0)
    char_device(root / "dev/nvidia-fs12", 240, 12)
    char_device(root / "dev/infiniband/uverbs0", 231, 192)
    found = nodes.gated(roots(root), tree, "/", ["gds", "mofed", "gdrcopy"])
    assert sorted(found) == ["gds", "mofed"]
    assert [n.path for n in found["gds"].nodes] == ["/dev/nvidia-fs0", "/dev/nvidia-fs12"]
    assert [m.path for m in found["gds"].mounts] == ["/run/udev", "/etc/cufile.json"]
    assert found["mofed"].mounts == ()
