"""Health recovery end to end: the plugin process, the stand-in NVML and the kubelet simulator.

Each story drives the stand-in NVML (XIDs, a GPU lost and found, a pending row remap, a reset) and
watches the device list the kubelet gets. Quiet periods are a second or two so that the stories are
short; what is asserted is the order of things (down, still down, back), never how long they took.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim

from .conftest import MakePlugin, PluginProcess

pytestmark = pytest.mark.slow

GPU = "nvidia.com/gpu"
TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def stays(kubelet: KubeletSim, healthy: int, seconds: float, count: int | None = None,
          name: str = GPU) -> None:
    """The list keeps `healthy` Healthy devices for `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kubelet.wait_for_resource(name, count=count, healthy=healthy, timeout=1)
        time.sleep(0.1)


def started(plugin: PluginProcess, kubelet: KubeletSim, count: int, name: str = GPU) -> None:
    plugin.start()
    kubelet.wait_for_resource(name, count=count, healthy=count, timeout=10)
    plugin.wait_for_log("Health checks:")


def test_a_transient_xid_comes_back_after_the_quiet_period(make_plugin: MakePlugin,
                                                          kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("mixed-4", HEALTH_RECOVERY_AFTER="2s")
    started(plugin, kubelet, 4)
    uuid = node.inventory.gpus[1].uuid
    node.inject_xid(uuid, 94)
    devices = kubelet.wait_for_resource(GPU, count=4, healthy=3, timeout=10)
    assert [d["id"] for d in devices if d["health"] == "Unhealthy"] == [uuid]
    plugin.wait_for_log(f"{uuid}: XID 94 (contained ECC error); it comes back by itself after 2s")
    kubelet.wait_for_resource(GPU, count=4, healthy=4, timeout=15)
    plugin.wait_for_log(f"{uuid} is healthy again: no critical XID for 2s and NVML reports it fine")
    plugin.wait_for_log(f"{GPU}: 1 device(s) healthy again (recovered from XID 94 (contained ECC error)): "
                        f"{uuid}")
    assert plugin.stop() == 0


def test_never_keeps_nvidias_behaviour(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("t4", HEALTH_RECOVERY_AFTER="never")
    started(plugin, kubelet, 1)
    plugin.wait_for_log("recovery off (Unhealthy until restart)")
    node.inject_xid(node.inventory.gpus[0].uuid, 94)
    kubelet.wait_for_resource(GPU, count=1, healthy=0, timeout=10)
    stays(kubelet, healthy=0, seconds=3)
    plugin.wait_for_log("health recovery is off (healthRecoveryAfter: never)")
    assert plugin.stop() == 0


def test_an_xid_storm_keeps_the_gpu_down_until_it_ends(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("t4", HEALTH_RECOVERY_AFTER="2s")
    started(plugin, kubelet, 1)
    uuid = node.inventory.gpus[0].uuid
    for _ in range(8):  # one XID every half second: each starts the 2 s quiet period again
        node.inject_xid(uuid, 94)
        time.sleep(0.5)
        kubelet.wait_for_resource(GPU, count=1, healthy=0, timeout=1)
    kubelet.wait_for_resource(GPU, count=1, healthy=1, timeout=15)
    assert plugin.log.count(f"XID 94 (contained ECC error) on {uuid}, which is already down") >= 6
    assert plugin.stop() == 0


def test_a_gpu_that_flaps_stays_down_and_says_so(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                tmp_path: Path) -> None:
    state = tmp_path / "health"
    plugin, node = make_plugin("t4", HEALTH_RECOVERY_AFTER="1s", HEALTH_FLAP_LIMIT="2",
                               HEALTH_STATE_DIR=str(state))
    started(plugin, kubelet, 1)
    uuid = node.inventory.gpus[0].uuid
    for _ in range(2):
        node.inject_xid(uuid, 94)
        kubelet.wait_for_resource(GPU, count=1, healthy=0, timeout=10)
        kubelet.wait_for_resource(GPU, count=1, healthy=1, timeout=15)
    node.inject_xid(uuid, 43)  # ignored by default: not a flap
    node.inject_xid(uuid, 31)
    node.inject_xid(uuid, 94)
    kubelet.wait_for_resource(GPU, count=1, healthy=0, timeout=10)
    xid = "XID 94 (contained ECC error)"
    plugin.wait_for_log(f"it went Unhealthy 3 times within the last hour ({xid}; {xid}; {xid}), more than "
                        f"the limit of 2, so it stays down: find the cause, then run `nvdp health clear "
                        f"{uuid}`")
    stays(kubelet, healthy=0, seconds=3)
    record = json.loads((state / "health.json").read_text())
    assert record["gpus"][uuid]["state"] == "flapping"
    (state / "clear").mkdir(exist_ok=True)
    (state / "clear" / uuid).touch()  # what `nvdp health clear` leaves
    kubelet.wait_for_resource(GPU, count=1, healthy=1, timeout=10)
    plugin.wait_for_log(f"{uuid} was cleared by hand and serves again")
    assert plugin.stop() == 0


def test_a_lost_gpu_stays_down_while_lost_and_returns_when_nvml_answers(make_plugin: MakePlugin,
                                                                       kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("mixed-4", HEALTH_RECOVERY_AFTER="1s")
    started(plugin, kubelet, 4)
    lost = node.inventory.gpus[2].uuid
    node.lose_gpu(lost)
    kubelet.wait_for_resource(GPU, count=4, healthy=3, timeout=10)
    stays(kubelet, healthy=3, seconds=3, count=4)
    plugin.wait_for_log(f"{lost}: XID 79 (GPU has fallen off the bus); it needs a GPU reset")
    node.find_gpu(lost)
    kubelet.wait_for_resource(GPU, count=4, healthy=4, timeout=15)
    plugin.wait_for_log(f"{lost} is healthy again: no critical XID for 1s and NVML shows it was reset")
    assert plugin.stop() == 0


def test_a_pending_row_remap_holds_the_gpu_until_a_reset_applies_it(make_plugin: MakePlugin,
                                                                   kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("a100-sxm-8", HEALTH_RECOVERY_AFTER="1s")
    started(plugin, kubelet, 8)
    uuid = node.inventory.gpus[5].uuid
    node.pending_remap(uuid)
    node.inject_xid(uuid, 63)  # "ignore" by the catalogue: the pending remap is what holds it
    kubelet.wait_for_resource(GPU, count=8, healthy=7, timeout=10)
    plugin.wait_for_log(f"{uuid} stays Unhealthy: a row remapping is pending (applied at the next GPU reset)")
    stays(kubelet, healthy=7, seconds=3, count=8)
    node.reset_gpu(uuid)
    kubelet.wait_for_resource(GPU, count=8, healthy=8, timeout=15)
    assert plugin.stop() == 0


def test_replicas_and_mig_devices_follow_their_gpu(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                  tmp_path: Path) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(TIME_SLICING)
    # The quiet period is what the test must see the devices down in: wide enough that a loaded machine's
    # polling cannot miss it (at 1 s one CI run saw the MIG devices back before it looked).
    plugin, node = make_plugin("t4", HEALTH_RECOVERY_AFTER="4s", CONFIG_FILE=str(config))
    started(plugin, kubelet, 4)
    node.inject_xid(node.inventory.gpus[0].uuid, 94)
    kubelet.wait_for_resource(GPU, count=4, healthy=0, timeout=10)
    kubelet.wait_for_resource(GPU, count=4, healthy=4, timeout=15)
    assert plugin.stop() == 0

    mig, mig_node = make_plugin("h100-mig-single", HEALTH_RECOVERY_AFTER="4s", MIG_STRATEGY="single")
    total = sum(len(g.mig_devices) for g in mig_node.inventory.gpus)
    gpu = mig_node.inventory.gpus[0]
    started(mig, kubelet, total)
    mig_node.inject_xid(gpu.uuid, 94)  # the whole GPU: every MIG device on it, and only those
    devices = kubelet.wait_for_resource(GPU, count=total, healthy=total - len(gpu.mig_devices), timeout=10)
    assert {d["id"] for d in devices if d["health"] == "Unhealthy"} == {m.uuid for m in gpu.mig_devices}
    kubelet.wait_for_resource(GPU, count=total, healthy=total, timeout=15)
    assert mig.stop() == 0


def test_a_restart_remembers_a_gpu_that_waits_for_a_reset(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                         tmp_path: Path) -> None:
    state = tmp_path / "health"
    plugin, node = make_plugin("mixed-4", HEALTH_RECOVERY_AFTER="1s", HEALTH_STATE_DIR=str(state))
    started(plugin, kubelet, 4)
    uuid = node.inventory.gpus[0].uuid
    node.ecc_errors(uuid, volatile=1)
    node.inject_xid(uuid, 95)
    kubelet.wait_for_resource(GPU, count=4, healthy=3, timeout=10)
    plugin.wait_for_log(f"{uuid}: XID 95 (uncontained ECC error); it needs a GPU reset")
    assert plugin.stop() == 0

    again = PluginProcess(plugin.plugin_dir, plugin.log_path, plugin.env).start()
    try:
        again.wait_for_log("Health record in", count=1)
        assert "1 GPU(s) stay down as before the restart" in again.log
        kubelet.wait_for_resource(GPU, count=4, healthy=3, timeout=10)
        again.wait_for_log("Health checks:", count=2)
        stays(kubelet, healthy=3, seconds=2, count=4)
        node.reset_gpu(uuid)  # volatile ECC count back to 0: NVML shows the reset
        kubelet.wait_for_resource(GPU, count=4, healthy=4, timeout=15)
    finally:
        assert again.stop() == 0


@pytest.mark.parametrize("value", ["-1s", "abc", "0"])
def test_a_bad_recovery_period_is_refused_at_start(make_plugin: MakePlugin, value: str) -> None:
    plugin, _node = make_plugin("t4", HEALTH_RECOVERY_AFTER=value)
    plugin.start()
    assert plugin.wait(30) == 1
    assert "HEALTH_RECOVERY_AFTER" in plugin.log
    assert "never" in plugin.log and "5m" in plugin.log, plugin.log  # the accepted forms
