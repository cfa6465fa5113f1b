"""What a user sees of a down GPU's device taints outside the plugin: `nvdp dra slices --health-record`
(computed with the plugin's functions) and the doctor's DRA slices check on slices published to a real
kube-apiserver, naming each tainted device and what brings it back."""

from __future__ import annotations

import argparse
import io
import json
import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from nvdp.dra import cli
from nvdp.dra.pool.devices import dra_devices
from nvdp.dra.pool.publish import SlicePublisher
from nvdp.dra.pool.taints import device_health, slice_taints
from nvdp.health.ledger import Cause, Ledger, Settings
from nvdp.health.state import write_state
from nvdp.health.xids import describe, xid_info
from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile
from nvdp.kube import connect
from tests.integration.test_doctor_dra import DRIVER, LOG, slices_finding
from tests.kube.envtest import ControlPlane

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"


def a100() -> Inventory:
    return load_profile(PROFILES / "a100-sxm-8.yaml")


def record_of(inventory: Inventory, down: dict[int, int]) -> dict[str, Any]:
    ledger = Ledger(Settings())
    for index, xid in down.items():
        gpu = inventory.gpus[index].uuid
        ledger.fault(gpu, [gpu], Cause(describe(xid), xid_info(xid).remedy, xid), time.time())
    return ledger.record()


def run_slices(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="nvdp")
    cli.add_parser(parser.add_subparsers())
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(parser.parse_args(["dra", "slices", *argv, "-o", "json"]), out, err)
    return code, out.getvalue(), err.getvalue()


def test_dra_slices_shows_the_taints_of_the_health_record(tmp_path: Path) -> None:
    inventory = a100()
    write_state(str(tmp_path), "nvidia-dra-plugin", record_of(inventory, {1: 48, 2: 94}), time.time())
    code, out, err = run_slices("--node", "a100-sxm-8", "--health-record", str(tmp_path / "health.json"))
    assert code == 0, err
    (obj,) = json.loads(out)
    kubernetes_validate.validate(obj, "1.36", strict=True)
    devices = {d["name"]: d for d in obj["spec"]["devices"]}
    assert len(devices) == 8  # the down GPUs stay in the pool
    assert {(t["key"], t.get("value")) for t in devices["gpu-1"]["taints"]} == {
        ("gpu.nvidia.com/xid", "48"), ("gpu.nvidia.com/recovery", "needs-reset")}
    assert {(t["key"], t.get("value")) for t in devices["gpu-2"]["taints"]} == {
        ("gpu.nvidia.com/xid", "94"), ("gpu.nvidia.com/recovery", "recovering")}
    assert "taints" not in devices["gpu-0"]
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("nvdp dra slices: gpu-1 (down) tainted gpu.nvidia.com/xid=48:NoSchedule, "
                               "gpu.nvidia.com/recovery=needs-reset:NoSchedule: XID 48 (double-bit ECC "
                               "error)")
    assert "comes back by itself at" in lines[1]


def test_dra_slices_uses_the_configs_taint_effect(tmp_path: Path) -> None:
    write_state(str(tmp_path), "nvidia-dra-plugin", record_of(a100(), {0: 48}), time.time())
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  plugin:\n    healthTaintEffect: NoExecute\n")
    code, out, _ = run_slices("--node", "a100-sxm-8", "--config", str(config), "--health-record",
                              str(tmp_path / "health.json"))
    assert code == 0
    (obj,) = json.loads(out)
    assert {t["effect"] for t in obj["spec"]["devices"][0]["taints"]} == {"NoExecute"}


@pytest.mark.parametrize(("content", "message"), [
    (None, "--health-record: cannot read"),
    ("{not json", "is not JSON"),
    ('{"version": 9}', "is not a version 1 health record"),
])  # fmt: skip
def test_dra_slices_refuses_a_record_it_cannot_use(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "health.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run_slices("--node", "a100-sxm-8", "--health-record", str(path))
    assert code == 2 and out == ""
    assert err.startswith("nvdp dra slices: error: --health-record: ") and message in err


@pytest.mark.slow
def test_the_doctor_names_tainted_devices_and_what_brings_each_back(kube_api: ControlPlane) -> None:
    inventory = a100()
    node = f"dra-doctor-taints-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node)
    devices = dra_devices(inventory)
    health = device_health(devices, record_of(inventory, {3: 48}), quiet_s=300.0,
                           informational={inventory.gpus[5].uuid: (13, time.time())})
    pub = SlicePublisher(connect(str(kube_api.admin_kubeconfig)), node=node, driver=DRIVER, log=LOG)
    assert pub.publish(devices, frozenset({inventory.gpus[3].uuid}), slice_taints(health)) == 1
    finding = slices_finding(kube_api, node, inventory)
    assert finding.status == "FAIL"
    assert ("tainted, kept from new claims: gpu-3 (XID 48 (double-bit ECC error); needs a GPU reset "
            "(nvidia-smi -r) or a node reboot, then comes back once NVML shows it)") in finding.detail
    assert "tainted without effect: gpu-5 (XID 13 (graphics engine exception), informational" in \
        finding.detail
    assert "not published" not in finding.detail  # it stays in the pool
    assert "its taints go when the GPU recovers" in finding.fix
    # Recovered: the taints go, only the informational one is noted.
    healthy = device_health(devices, None, quiet_s=300.0,
                            informational={inventory.gpus[5].uuid: (13, time.time())})
    assert pub.publish(devices, frozenset(), slice_taints(healthy)) == 1
    finding = slices_finding(kube_api, node, inventory)
    assert finding.status == "PASS" and "tainted without effect: gpu-5" in finding.detail
