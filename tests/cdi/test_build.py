"""The specs built from hand-written host facts: the design note's example field by field, names,
hooks, feature flags, the hook-less mode, the other classes, the set's operations, and refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.cdi.build import SpecSet, build_specs
from nvdp.cdi.errors import CdiError
from nvdp.cdi.facts import GatedFiles, HostFacts, HostFile, Library, Node, Roots
from nvdp.cdi.spec import encode
from nvdp.config.model import Config, Flags, Imex, PluginFlags
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from nvdp.plan import plan
from tests.cdi.cdischema import schema_errors

VERSION = "570.124.06"
LIB = "/usr/lib/x86_64-linux-gnu"
GPU0 = Gpu(index=0, uuid="GPU-0b8c4f2e-6d1a-4c3b-9e7f-2a5d8c1e4b60", name="NVIDIA A100-SXM4-80GB",
           memory_bytes=80 << 30, compute_capability=(8, 0), minor=0, pci_bus_id="00000000:17:00.0")
GPU1 = Gpu(index=1, uuid="GPU-1c9d5a3f-7e2b-4d4c-8f80-3b6e9d2f5c71", name="NVIDIA A100-SXM4-80GB",
           memory_bytes=80 << 30, compute_capability=(8, 0), minor=1, pci_bus_id="00000000:18:00.0",
           mig_capable=True, mig_enabled=True)
MIG = MigDevice(uuid="MIG-5f3e2a1b-7c9d-5e8f-a0b1-c2d3e4f5a6b7", index=0, parent_uuid=GPU1.uuid,
                parent_index=1, profile="1g.10gb", gi_id=1, ci_id=0, memory_bytes=10 << 30)
INVENTORY = Inventory(driver_version=VERSION, cuda_driver_version="12.8",
                      gpus=(GPU0, replace(GPU1, mig_devices=(MIG,))))
ROOTS = Roots(driver_root="/driver-root", target_driver_root="/", dev_root="/driver-root",
              target_dev_root="/")


def node(path: str, major: int, minor: int, mode: int = 0o666, gid: int = 0) -> Node:
    return Node(path, path, major=major, minor=minor, mode=mode, gid=gid)


def lib(name: str, soname: str | None = None, folder: str = LIB) -> Library:
    return Library(f"{folder}/{name}", f"{folder}/{name}", soname)


def file(path: str) -> HostFile:
    return HostFile(path, path)


# The design note's §1.8 node: one GPU with DRM nodes (group-owned, 0660), one MIG GPU with one MIG device
# (GI 1 / CI 0, cap minors 147 and 148), nvidia-caps major 237, uvm major 235.
FACTS = HostFacts(
    roots=ROOTS,
    driver_version=VERSION,
    lib_dirs=(LIB,),
    libraries=(lib(f"libcuda.so.{VERSION}", "libcuda.so.1"),
               lib(f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1"),
               lib(f"libvdpau_nvidia.so.{VERSION}", None, f"{LIB}/vdpau")),
    firmware=(file(f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"),),
    binaries=(file("/usr/bin/nvidia-smi"),),
    ipc=(file("/run/nvidia-persistenced/socket"),),
    symlinks={LIB: frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})},
    control_nodes=(node("/dev/nvidiactl", 195, 255), node("/dev/nvidia-uvm", 235, 0),
                   node("/dev/nvidia-uvm-tools", 235, 1), node("/dev/nvidia-modeset", 195, 254)),
    gpu_nodes={0: node("/dev/nvidia0", 195, 0), 1: node("/dev/nvidia1", 195, 1)},
    drm_nodes={"0000:17:00.0": (node("/dev/dri/card1", 226, 1, 0o660, 44),
                                node("/dev/dri/renderD128", 226, 128, 0o660, 993))},
    drm_links={"0000:17:00.0": ("../card1::/dev/dri/by-path/pci-0000:17:00.0-card",
                                "../renderD128::/dev/dri/by-path/pci-0000:17:00.0-render")},
    mig_caps={"gpu1/gi1/access": node("/dev/nvidia-caps/nvidia-cap147", 237, 147, 0o400),
              "gpu1/gi1/ci0/access": node("/dev/nvidia-caps/nvidia-cap148", 237, 148, 0o400)},
)
RO = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def hook(*args: str, path: str = "/usr/bin/nvidia-ctk") -> dict[str, Any]:
    return {"hookName": "createContainer", "path": path, "args": ["nvidia-ctk", "hook", *args],
            "env": ["NVIDIA_CTK_DEBUG=false"]}


def dn(path: str, major: int, minor: int = 0, mode: int = 438, gid: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"path": path, "hostPath": path, "major": major}
    if minor:
        out["minor"] = minor
    out.update(fileMode=mode, permissions="rwm")
    if gid:
        out["gid"] = gid
    return out


def mount(path: str, options: list[str] = RO) -> dict[str, Any]:
    return {"hostPath": path, "containerPath": path, "options": options}


GPU0_EDITS = {
    "deviceNodes": [dn("/dev/nvidia0", 195), dn("/dev/dri/card1", 226, 1, 432, 44),
                    dn("/dev/dri/renderD128", 226, 128, 432, 993)],
    "hooks": [hook("create-symlinks", "--link", "../card1::/dev/dri/by-path/pci-0000:17:00.0-card",
                   "--link", "../renderD128::/dev/dri/by-path/pci-0000:17:00.0-render")],
    "additionalGids": [44, 993],
}
MIG_EDITS = {"deviceNodes": [dn("/dev/nvidia1", 195, 1), dn("/dev/nvidia-caps/nvidia-cap147", 237, 147, 256),
                             dn("/dev/nvidia-caps/nvidia-cap148", 237, 148, 256)]}
DESIGN_NOTE_SPEC = {
    "cdiVersion": "0.7.0",
    "kind": "k8s.device-plugin.nvidia.com/gpu",
    "devices": [
        {"name": GPU0.uuid, "containerEdits": GPU0_EDITS},
        {"name": MIG.uuid, "containerEdits": MIG_EDITS},
        {"name": "all", "containerEdits": {  # nvdp's addition: the union, simplified
            "deviceNodes": [dn("/dev/nvidia0", 195), dn("/dev/nvidia1", 195, 1),
                            dn("/dev/dri/card1", 226, 1, 432, 44),
                            dn("/dev/dri/renderD128", 226, 128, 432, 993),
                            dn("/dev/nvidia-caps/nvidia-cap147", 237, 147, 256),
                            dn("/dev/nvidia-caps/nvidia-cap148", 237, 148, 256)],
            "hooks": GPU0_EDITS["hooks"],
            "additionalGids": [44, 993],
        }},
    ],
    "containerEdits": {
        "env": [f"NVIDIA_CTK_LIBCUDA_DIR={LIB}", "NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [dn("/dev/nvidia-modeset", 195, 254), dn("/dev/nvidia-uvm", 235),
                        dn("/dev/nvidia-uvm-tools", 235, 1), dn("/dev/nvidiactl", 195, 255)],
        "hooks": [
            hook("create-symlinks", "--link", f"libcuda.so.1::{LIB}/libcuda.so",
                 "--link", f"libcuda.so.{VERSION}::{LIB}/libcuda.so.1",
                 "--link", f"libnvidia-ml.so.{VERSION}::{LIB}/libnvidia-ml.so.1"),
            hook("enable-cuda-compat", f"--host-driver-version={VERSION}"),
            hook("update-ldcache", "--folder", LIB, "--folder", f"{LIB}/vdpau"),
            hook("disable-device-node-modification"),
            hook("update-application-profile"),
        ],
        "mounts": [  # by path depth, then path
            mount("/run/nvidia-persistenced/socket", ["nosuid", "nodev", "rbind", "rprivate", "noexec"]),
            mount("/usr/bin/nvidia-smi"),
            mount(f"{LIB}/libcuda.so.{VERSION}"),
            mount(f"{LIB}/libnvidia-ml.so.{VERSION}"),
            mount(f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"),
            mount(f"{LIB}/vdpau/libvdpau_nvidia.so.{VERSION}"),
        ],
    },
}


def config(*, strategy: str = "uuid", hook_path: str = "/usr/bin/nvidia-ctk", mig: str = "mixed",
           channels: tuple[int, ...] = (), gated: tuple[str, ...] = (), **plugin: Any) -> Config:
    flags = PluginFlags(device_list_strategy=("cdi-cri",), device_id_strategy=strategy,  # type: ignore[arg-type]
                        nvidia_ctk_path=hook_path, **plugin)
    return Config(flags=Flags(mig_strategy=mig, plugin=flags, gdrcopy_enabled="gdrcopy" in gated,  # type: ignore[arg-type]
                              gds_enabled="gds" in gated, mofed_enabled="mofed" in gated),
                  imex=Imex(channel_ids=channels))


def build(cfg: Config, facts: HostFacts = FACTS, inventory: Inventory = INVENTORY) -> SpecSet:
    return build_specs(cfg, inventory, plan(cfg, inventory), facts)


def as_json(specs: SpecSet, cls: str = "gpu") -> dict[str, Any]:
    spec = specs.spec(cls)
    assert spec is not None
    document: dict[str, Any] = json.loads(encode(spec))
    assert schema_errors(document) == []
    return document


def device_edits(document: dict[str, Any], name: str) -> dict[str, Any]:
    edits: dict[str, Any] = next(d for d in document["devices"] if d["name"] == name)["containerEdits"]
    return edits


def test_the_design_notes_example_field_by_field() -> None:
    assert as_json(build(config())) == DESIGN_NOTE_SPEC


def test_index_names_and_mig_strategy_none_advertises_the_mig_gpu_whole() -> None:
    document = as_json(build(config(strategy="index", mig="none")))
    # 1:0 is the MIG device (always described, as NVIDIA does); 1 is GPU 1 whole, which the plan advertises.
    assert [d["name"] for d in document["devices"]] == ["0", "1", "1:0", "all"]
    assert device_edits(document, "1") == {"deviceNodes": [dn("/dev/nvidia1", 195, 1)]}
    assert device_edits(document, "1:0") == MIG_EDITS


def test_names_are_those_allocate_emits() -> None:
    specs = build(config(strategy="index"))
    assert specs.names() == {f"k8s.device-plugin.nvidia.com/gpu={n}" for n in ("0", "1:0", "all")}
    assert specs.classes() == {"gpu"}


def test_the_hook_binarys_name_picks_the_argument_form() -> None:
    path = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    hooks = as_json(build(config(hook_path=path)))["containerEdits"]["hooks"]
    assert {h["path"] for h in hooks} == {path}
    assert [h["args"][:2] for h in hooks] == [["nvidia-cdi-hook", "create-symlinks"],
                                              ["nvidia-cdi-hook", "enable-cuda-compat"],
                                              ["nvidia-cdi-hook", "update-ldcache"],
                                              ["nvidia-cdi-hook", "disable-device-node-modification"],
                                              ["nvidia-cdi-hook", "update-application-profile"]]


def test_disabled_hooks_are_left_out() -> None:
    document = as_json(build(config(cdi_disable_hooks=("update-ldcache", "create-symlinks"))))
    assert [h["args"][2] for h in document["containerEdits"]["hooks"]] == [
        "enable-cuda-compat", "disable-device-node-modification", "update-application-profile"]
    assert "hooks" not in device_edits(document, GPU0.uuid)  # the by-path links are create-symlinks too


def test_no_additional_gids_feature_flag() -> None:
    document = as_json(build(config(cdi_feature_flags=("no-additional-gids-for-device-nodes",))))
    assert document["cdiVersion"] == "0.5.0"
    assert all("additionalGids" not in d["containerEdits"] for d in document["devices"])
    assert device_edits(document, GPU0.uuid)["deviceNodes"][1]["gid"] == 44  # the node keeps its group


def test_every_hook_disabled_mounts_the_libraries_at_their_sonames_and_links() -> None:
    document = as_json(build(config(cdi_disable_hooks=("all",))))
    common = document["containerEdits"]
    assert "hooks" not in common
    assert all("hooks" not in d["containerEdits"] for d in document["devices"])
    extra = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    assert extra[f"{LIB}/libcuda.so.1"] == f"{LIB}/libcuda.so.{VERSION}"
    assert extra[f"{LIB}/libcuda.so"] == f"{LIB}/libcuda.so.{VERSION}"
    assert extra[f"{LIB}/libnvidia-ml.so.1"] == f"{LIB}/libnvidia-ml.so.{VERSION}"
    assert len(common["mounts"]) == len(DESIGN_NOTE_SPEC["containerEdits"]["mounts"]) + 3  # type: ignore[index]


def test_a_mig_device_described_from_proc_has_type_and_no_host_path() -> None:
    caps = {
        "gpu1/gi1/access": Node("/dev/nvidia-caps/nvidia-cap147", type="c", major=237, minor=147, mode=0o400),
        "gpu1/gi1/ci0/access": Node("/dev/nvidia-caps/nvidia-cap148", type="c", major=237, minor=148),
    }
    document = as_json(build(config(), replace(FACTS, mig_caps=caps)))
    assert device_edits(document, MIG.uuid)["deviceNodes"][1:] == [
        {"path": "/dev/nvidia-caps/nvidia-cap147", "type": "c", "major": 237, "minor": 147, "fileMode": 256},
        {"path": "/dev/nvidia-caps/nvidia-cap148", "type": "c", "major": 237, "minor": 148},
    ]


def test_a_gfx_mig_profile_gets_the_drm_nodes() -> None:
    gfx = replace(MIG, profile="1g.24gb+gfx")
    facts = replace(FACTS, drm_nodes={"0000:18:00.0": (node("/dev/dri/card2", 226, 2),)})
    inventory = replace(INVENTORY, gpus=(GPU0, replace(GPU1, mig_devices=(gfx,))))
    document = as_json(build(config(), facts, inventory))
    assert dn("/dev/dri/card2", 226, 2) in device_edits(document, MIG.uuid)["deviceNodes"]


def test_a_missing_gpu_node_is_refused_with_the_fix() -> None:
    with pytest.raises(CdiError, match=r"GPU GPU-0b8c.* \(index 0\): no character device /dev/nvidia0 "
                                       r"under the dev root /driver-root, so a container would get no GPU"):
        build(config(), replace(FACTS, gpu_nodes={1: FACTS.gpu_nodes[1]}))


def test_a_missing_mig_capability_is_refused_with_the_fix() -> None:
    with pytest.raises(CdiError, match=r"MIG device MIG-5f3e.* \(1:0, profile 1g.10gb\): no capability minor "
                                       r"for gpu1/gi1/ci0/access"):
        build(config(), replace(FACTS, mig_caps={"gpu1/gi1/access": FACTS.mig_caps["gpu1/gi1/access"]}))


def test_no_gpu_means_no_gpu_spec() -> None:
    empty = Inventory(driver_version=VERSION, cuda_driver_version="12.8")
    assert build(config(), FACTS, empty).specs == ()


def test_imex_channels_as_nvidia_writes_them() -> None:
    facts = replace(FACTS, imex_channels={0: Node("/dev/nvidia-caps-imex-channels/channel0",
                                                  "/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel0",
                                                  major=511)})
    assert as_json(build(config(channels=(0, 1)), facts), "imex-channel") == {
        "cdiVersion": "0.5.0",
        "kind": "k8s.device-plugin.nvidia.com/imex-channel",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{
            "path": "/dev/nvidia-caps-imex-channels/channel0",
            "hostPath": "/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel0"}]}}],
        "containerEdits": {},
    }
    assert build(config(channels=(1,)), facts).classes() == {"gpu"}  # channel 1 is not on the node


def test_gated_modes_need_their_flag_and_their_files() -> None:
    gds = GatedFiles(nodes=(node("/dev/nvidia-fs0", 240, 0),), mounts=(file("/etc/cufile.json"),))
    facts = replace(FACTS, gated={"gds": gds})
    assert build(config(gated=("gds", "mofed")), facts).classes() == {"gpu", "gds"}
    assert build(config(), facts).classes() == {"gpu"}
    assert as_json(build(config(gated=("gds",)), facts), "gds") == {
        "cdiVersion": "0.5.0",  # hostPath
        "kind": "k8s.device-plugin.nvidia.com/gds",
        "devices": [{"name": "all", "containerEdits": {"deviceNodes": [dn("/dev/nvidia-fs0", 240)],
                                                       "mounts": [mount("/etc/cufile.json")]}}],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
    }


def test_merged_sets_resolve_the_names_of_both() -> None:
    uuid_specs = build(config(strategy="uuid"))
    channel = Node("/dev/nvidia-caps-imex-channels/channel0", "/x")
    index_specs = build(config(strategy="index", channels=(0,)), replace(FACTS, imex_channels={0: channel}))
    merged = uuid_specs.merged(index_specs)
    assert merged.names() == uuid_specs.names() | index_specs.names()
    assert [s.cls for s in merged.specs] == ["gpu", "imex-channel"]
    gpu = merged.spec("gpu")
    assert gpu is not None and gpu.container_edits == index_specs.specs[0].container_edits
    assert [d.name for d in gpu.devices] == sorted(d.name for d in gpu.devices)


def test_merged_all_covers_the_devices_of_both() -> None:
    only_gpu0 = build(config(), FACTS, replace(INVENTORY, gpus=(GPU0,)))
    only_mig = build(config(), FACTS, replace(INVENTORY, gpus=(replace(GPU1, mig_devices=(MIG,)),)))
    merged = as_json(only_gpu0.merged(only_mig))
    paths = {n["path"] for n in device_edits(merged, "all")["deviceNodes"]}
    assert {"/dev/nvidia0", "/dev/dri/card1", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap148"} <= paths
