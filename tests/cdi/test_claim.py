"""Per-claim CDI specs (DRA mode): names after NVIDIA's DRA driver, the device plugin's edits for the same
devices, NVIDIA_VISIBLE_DEVICES=void as NVIDIA writes it, validity, and the spec files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.cdi.build import build_specs
from nvdp.cdi.claim import (
    CLAIM_CLASS,
    CLAIM_VENDOR,
    ClaimDevice,
    RequestFile,
    claim_cdi_ids,
    claim_device_name,
    claim_file_id,
    claim_spec,
    dra_device_name,
)
from nvdp.cdi.errors import CdiError
from nvdp.cdi.host import discover_host
from nvdp.cdi.spec import Spec, decode, encode, validate
from nvdp.cdi.write import claim_spec_path, claim_spec_uids, remove_claim_spec, write_claim_spec
from nvdp.config.model import Config, Flags, PluginFlags
from nvdp.inventory.model import Inventory
from nvdp.plan import plan
from tests.cdi.cdischema import schema_errors
from tests.cdi.test_build import FACTS, GPU0, GPU0_EDITS, GPU1, INVENTORY, LIB, MIG, MIG_EDITS, config
from tests.cdi.test_mig import CAPS_MAJOR, inventory, kernel_minor, node_tree, stat_form
from tests.cdi.trees import needs_root

__all__ = ["inventory"]  # the h100-mig-8 inventory fixture, shared with test_mig

UID = "dab5ab50-5a1c-4b6e-9d3f-0c7e2f1a8b94"
# GPU 1 with MIG off: a second full GPU for the two-GPU claim.
GPU1_WHOLE = replace(GPU1, mig_enabled=False, mig_devices=())
TWO_GPUS = Inventory(driver_version=INVENTORY.driver_version, cuda_driver_version="12.8",
                     gpus=(GPU0, GPU1_WHOLE))


def as_json(spec: Spec) -> dict[str, Any]:
    validate(spec)
    document: dict[str, Any] = json.loads(encode(spec))
    assert schema_errors(document) == []
    return document


def device_edits(document: dict[str, Any], name: str) -> dict[str, Any]:
    edits: dict[str, Any] = next(d for d in document["devices"] if d["name"] == name)["containerEdits"]
    return edits


def plugin_common_edits(cfg: Config, inventory: Inventory = INVENTORY) -> dict[str, Any]:
    spec = build_specs(cfg, inventory, plan(cfg, inventory), FACTS).spec("gpu")
    assert spec is not None
    common: dict[str, Any] = json.loads(encode(spec))["containerEdits"]
    return common


# --- names ---------------------------------------------------------------------------------------------


def test_names_follow_nvidias_dra_driver() -> None:
    assert (CLAIM_VENDOR, CLAIM_CLASS) == ("k8s.gpu.nvidia.com", "claim")
    assert claim_device_name(UID, "gpu-0") == f"{UID}-gpu-0"
    assert claim_spec_path("/var/run/cdi", UID) == f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{UID}.json"
    # CDI's GenerateTransientSpecName turns '/' into '_'.
    assert claim_spec_path("/x", "a/b") == "/x/k8s.gpu.nvidia.com-claim_a_b.json"


@pytest.mark.parametrize(("cdi_name", "uid", "dra_name"), [
    (f"{UID}-gpu-0", UID, "gpu-0"),
    (f"{UID}-gpu-0", None, "gpu-0"),
    (f"{UID}-gpu-3-mig-1g10gb-19-4", None, "gpu-3-mig-1g10gb-19-4"),
    ("u1-gpu-12", None, "gpu-12"),
    ("x-gpu-1-gpu-0", None, "gpu-0"),       # a uid that holds "-gpu-" itself
    ("x-gpu-1-gpu-0", "x-gpu-1", "gpu-0"),
])
def test_the_dra_device_name_inside_a_cdi_name(cdi_name: str, uid: str | None, dra_name: str) -> None:
    assert dra_device_name(cdi_name, uid) == dra_name


# --- specs from hand-written host facts (tests/cdi/test_build.py's node) -----------------------------------


def test_a_claim_with_one_gpu() -> None:
    cfg = config()
    spec = claim_spec(cfg, INVENTORY, FACTS, UID, [ClaimDevice(name="gpu-0", gpu=GPU0)])
    document = as_json(spec)
    assert document["kind"] == "k8s.gpu.nvidia.com/claim"
    assert document["cdiVersion"] == "0.7.0"  # additionalGids of the DRM nodes
    assert [d["name"] for d in document["devices"]] == [f"{UID}-gpu-0"]
    # The device plugin's edits for the same GPU, and its common edits.
    assert device_edits(document, f"{UID}-gpu-0") == GPU0_EDITS
    assert document["containerEdits"] == plugin_common_edits(cfg)
    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIB}" in document["containerEdits"]["env"]
    assert claim_cdi_ids(spec) == {"gpu-0": f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"}
    assert claim_cdi_ids(spec, UID) == claim_cdi_ids(spec)


def test_a_claim_with_two_gpus() -> None:
    cfg = config()
    devices = [ClaimDevice(name="gpu-1", gpu=GPU1_WHOLE), ClaimDevice(name="gpu-0", gpu=GPU0)]
    spec = claim_spec(cfg, TWO_GPUS, FACTS, UID, devices)
    document = as_json(spec)
    assert [d["name"] for d in document["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-1"]  # sorted
    assert device_edits(document, f"{UID}-gpu-0") == GPU0_EDITS
    assert device_edits(document, f"{UID}-gpu-1") == {"deviceNodes": [
        {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1", "major": 195, "minor": 1, "fileMode": 438,
         "permissions": "rwm"}]}
    assert "NVIDIA_VISIBLE_DEVICES=void" in document["containerEdits"]["env"]
    assert claim_cdi_ids(spec, UID) == {
        "gpu-0": f"k8s.gpu.nvidia.com/claim={UID}-gpu-0",
        "gpu-1": f"k8s.gpu.nvidia.com/claim={UID}-gpu-1",
    }


def test_a_requests_metadata_file_is_mounted_read_only_by_a_cdi_device_of_its_own() -> None:
    # KEP-5304: each request's file at the container path the kubelet's helper uses; the kubelet hands
    # the file's CDI device to the containers of that request, and it is no DRA device.
    target = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/gpu/gpu.nvidia.com-metadata.json"
    files = [RequestFile(request="gpu", host_path=f"/var/lib/kubelet/plugins/gpu.nvidia.com/m/{UID}/gpu",
                         container_path=target)]
    spec = claim_spec(config(), INVENTORY, FACTS, UID, [ClaimDevice(name="gpu-0", gpu=GPU0)], files=files)
    document = as_json(spec)
    assert [d["name"] for d in document["devices"]] == [f"{UID}-gpu-0", f"{UID}-metadata-gpu"]
    assert device_edits(document, f"{UID}-metadata-gpu") == {"mounts": [
        {"hostPath": files[0].host_path, "containerPath": target,
         "options": ["ro", "nosuid", "nodev", "bind"]}]}
    assert claim_cdi_ids(spec, UID) == {"gpu-0": f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"}
    assert claim_file_id(UID, "gpu") == f"k8s.gpu.nvidia.com/claim={UID}-metadata-gpu"


def test_a_claim_with_a_gpu_and_a_mig_device() -> None:
    devices = [ClaimDevice(name="gpu-0", gpu=GPU0),
               ClaimDevice(name="gpu-1-mig-1g10gb-19-0", gpu=GPU1, mig=MIG)]
    spec = claim_spec(config(), INVENTORY, FACTS, UID, devices)
    document = as_json(spec)
    assert device_edits(document, f"{UID}-gpu-1-mig-1g10gb-19-0") == MIG_EDITS
    assert "NVIDIA_VISIBLE_DEVICES=void" in document["containerEdits"]["env"]
    assert set(claim_cdi_ids(spec)) == {"gpu-0", "gpu-1-mig-1g10gb-19-0"}


def test_the_claims_gpus_are_not_named_in_nvidia_visible_devices() -> None:
    # A legacy nvidia-container-runtime hook reads NVIDIA_VISIBLE_DEVICES and injects what it names;
    # with the CDI devices doing that, a device list there would inject the GPUs a second time.
    devices = [ClaimDevice(name="gpu-0", gpu=GPU0),
               ClaimDevice(name="gpu-1-mig-1g10gb-19-0", gpu=GPU1, mig=MIG)]
    env = as_json(claim_spec(config(), INVENTORY, FACTS, UID, devices))["containerEdits"]["env"]
    assert [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert not [e for e in env if GPU0.uuid in e or MIG.uuid in e], env


def test_a_device_named_twice_is_one_cdi_device() -> None:
    twice = [ClaimDevice("gpu-0", GPU0), ClaimDevice("gpu-0", GPU0)]
    spec = claim_spec(config(), INVENTORY, FACTS, UID, twice)
    assert [d.name for d in spec.devices] == [f"{UID}-gpu-0"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec.container_edits.env


def test_hooks_and_feature_flags_are_the_device_plugins() -> None:
    cfg = config(hook_path="/opt/nvidia/nvidia-cdi-hook",
                 cdi_feature_flags=("no-additional-gids-for-device-nodes",))
    document = as_json(claim_spec(cfg, INVENTORY, FACTS, UID, [ClaimDevice("gpu-0", GPU0)]))
    edits = device_edits(document, f"{UID}-gpu-0")
    assert "additionalGids" not in edits
    assert edits["hooks"][0]["path"] == "/opt/nvidia/nvidia-cdi-hook"
    assert document["containerEdits"] == plugin_common_edits(cfg)


def test_a_claim_without_devices_is_refused() -> None:
    with pytest.raises(CdiError, match="no devices"):
        claim_spec(config(), INVENTORY, FACTS, UID, [])


def test_a_gpu_without_its_device_node_is_refused_with_the_fix() -> None:
    facts = replace(FACTS, gpu_nodes={1: FACTS.gpu_nodes[1]})
    with pytest.raises(CdiError, match=r"no character device /dev/nvidia0 .*run nvidia-smi"):
        claim_spec(config(), INVENTORY, facts, UID, [ClaimDevice("gpu-0", GPU0)])


def test_an_invalid_claim_uid_is_refused() -> None:
    with pytest.raises(CdiError, match="invalid CDI device name"):
        claim_spec(config(), INVENTORY, FACTS, "bad uid!", [ClaimDevice("gpu-0", GPU0)])


# --- a MIG device on h100-mig-8: the stand-in NVML and a fake driver tree (tests/cdi/test_mig.py) -----------


@pytest.mark.slow
@needs_root
def test_a_mig_device_on_h100_mig_8(tmp_path: Path, inventory: Inventory) -> None:
    root, proc = node_tree(tmp_path, inventory)
    plugin = PluginFlags(device_list_strategy=("cdi-cri",), container_driver_root=str(root))
    cfg = Config(flags=Flags(mig_strategy="mixed", plugin=plugin))
    facts = discover_host(cfg, inventory, sysfs_root=str(tmp_path / "sys"), proc_root=str(proc), environ={})
    gpu = inventory.gpus[0]
    mig = next(m for m in gpu.mig_devices if m.uuid == "MIG-97a0be89-cb0d-4ac8-8582-022c154ec604")
    name = f"gpu-0-mig-{mig.profile.replace('.', '')}-{mig.gi_id}-0"
    other = inventory.gpus[1].mig_devices[0]
    other_name = f"gpu-1-mig-{other.profile.replace('.', '')}-{other.gi_id}-0"
    spec = claim_spec(cfg, inventory, facts, UID,
                      [ClaimDevice(name, gpu, mig), ClaimDevice(other_name, inventory.gpus[1], other)])
    document = as_json(spec)
    assert document["kind"] == "k8s.gpu.nvidia.com/claim"
    # GPU 0, GI 7 / CI 0 (minors 66, 67): the host has the cap nodes, so they are stat'ed.
    assert device_edits(document, f"{UID}-{name}") == {"deviceNodes": [
        stat_form("/dev/nvidia0", 195, 0, 0o666),
        stat_form("/dev/nvidia-caps/nvidia-cap66", CAPS_MAJOR, 66, 0o444),
        stat_form("/dev/nvidia-caps/nvidia-cap67", CAPS_MAJOR, 67, 0o444),
    ]}
    # GPU 1: no host cap nodes, described from /proc for the runtime to create.
    gi, ci = kernel_minor(1, other.gi_id), kernel_minor(1, other.gi_id, other.ci_id)
    assert device_edits(document, f"{UID}-{other_name}")["deviceNodes"][1:] == [
        {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "type": "c", "major": CAPS_MAJOR, "minor": m}
        for m in (gi, ci)
    ]
    # The same edits as the device plugin's spec gives these MIG devices.
    gpu_spec = build_specs(cfg, inventory, plan(cfg, inventory), facts).spec("gpu")
    assert gpu_spec is not None
    plugin_doc = json.loads(encode(gpu_spec))
    for cdi_name, uuid in ((f"{UID}-{name}", mig.uuid), (f"{UID}-{other_name}", other.uuid)):
        assert device_edits(document, cdi_name) == device_edits(plugin_doc, uuid)
    assert "NVIDIA_VISIBLE_DEVICES=void" in document["containerEdits"]["env"]
    assert claim_cdi_ids(spec, UID) == {name: f"k8s.gpu.nvidia.com/claim={UID}-{name}",
                                        other_name: f"k8s.gpu.nvidia.com/claim={UID}-{other_name}"}


# --- the spec files ----------------------------------------------------------------------------------------


def test_write_list_and_remove_claim_specs(tmp_path: Path) -> None:
    directory = tmp_path / "cdi"  # made when missing
    spec = claim_spec(config(), INVENTORY, FACTS, UID, [ClaimDevice("gpu-0", GPU0)])
    write_claim_spec(str(directory), spec, UID)
    path = Path(claim_spec_path(str(directory), UID))
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert decode(path.read_bytes(), str(path)) == spec
    assert schema_errors(json.loads(path.read_text())) == []
    mtime = path.stat().st_mtime_ns
    write_claim_spec(str(directory), spec, UID)  # the same bytes: left alone
    assert path.stat().st_mtime_ns == mtime
    # Other files in the folder are not claim specs of this driver.
    for other in ("k8s.device-plugin.nvidia.com-gpu.json", f"k8s.gpu.nvidia.com-claim_{UID}x.yaml",
                  "k8s.gpu.nvidia.com-claim_.json", "k8s.gpu.nvidia.com-gpu.json", ".nvdp-spec.1.tmp"):
        (directory / other).write_text("{}")
    write_claim_spec(str(directory), spec, "second-uid")
    assert claim_spec_uids(str(directory)) == {UID, "second-uid"}
    assert remove_claim_spec(str(directory), UID)
    assert not remove_claim_spec(str(directory), UID)
    assert claim_spec_uids(str(directory)) == {"second-uid"}
    assert len(os.listdir(directory)) == 6


def test_claim_spec_uids_of_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert claim_spec_uids(str(tmp_path / "nothing")) == frozenset()


def test_only_a_claim_spec_is_written_as_one(tmp_path: Path) -> None:
    gpu_spec = build_specs(config(), INVENTORY, plan(config(), INVENTORY), FACTS).spec("gpu")
    assert gpu_spec is not None
    with pytest.raises(ValueError, match=r"k8s\.gpu\.nvidia\.com/claim"):
        write_claim_spec(str(tmp_path), gpu_spec, UID)


def test_a_folder_that_cannot_be_made_names_the_fix(tmp_path: Path) -> None:
    in_the_way = tmp_path / "cdi"
    in_the_way.write_text("a file, not a folder")
    spec = claim_spec(config(), INVENTORY, FACTS, UID, [ClaimDevice("gpu-0", GPU0)])
    with pytest.raises(CdiError, match="mount the host's /var/run/cdi"):
        write_claim_spec(str(in_the_way), spec, UID)
