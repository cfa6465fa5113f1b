"""The plugin process end to end: stand-in NVML, kubelet simulator, real sockets and signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvdp.config.loader import load_config
from nvdp.plan import plan
from nvdp.plugin.allocate import CONTROL_DEVICE_PATHS
from sim.kubelet import KubeletSim

from .cdi_node import make_cdi_node
from .conftest import MakeBarePlugin, MakePlugin, PluginProcess

pytestmark = pytest.mark.slow

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 10
"""


def stop_cleanly(plugin: PluginProcess) -> None:
    assert plugin.stop() == 0, plugin.log
    assert plugin.sockets() == []
    assert "Stopping plugins." in plugin.log


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_t4_registers_and_allocates(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("t4")
    plugin.start()
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=1, timeout=10)
    uuid = node.inventory.gpus[0].uuid
    assert [d["id"] for d in devices] == [uuid]
    (registration,) = kubelet.registrations
    assert registration["version"] == "v1beta1"
    assert registration["endpoint"] == "nvidia-gpu.sock"
    assert registration["options"]["get_preferred_allocation_available"] is True
    response = kubelet.allocate("nvidia.com/gpu", [[uuid]])
    assert response["container_responses"][0]["envs"] == {"NVIDIA_VISIBLE_DEVICES": uuid}
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet")
    plugin.wait_for_log("Health checks:")
    # Health checking starts after registering, as in NVIDIA's plugin, not competing with it.
    assert plugin.log.index("Registered device plugin") < plugin.log.index("Health checks:")
    for line in ("Starting NVIDIA device plugin (nvdp ", "Configuration from defaults",
                 "NVML: driver 550.54.15, CUDA 12.4, 1 GPU(s)",
                 f"GPU 0: Tesla T4, {uuid}, 15360 MiB, MIG disabled", "Resource nvidia.com/gpu: 1 devices"):
        assert line in plugin.log
    stop_cleanly(plugin)


@pytest.mark.parametrize(("profile", "mig_strategy"), [("a100-sxm-8", "none"), ("h100-mig-8", "mixed"),
                                                       ("mixed-4", "none")])
def test_profiles_advertise_the_plan(make_plugin: MakePlugin, kubelet: KubeletSim,
                                     profile: str, mig_strategy: str) -> None:
    plugin, node = make_plugin(profile, MIG_STRATEGY=mig_strategy)
    expected = plan(load_config(env={"MIG_STRATEGY": mig_strategy}), node.inventory)
    assert expected.resources
    plugin.start()
    for resource in expected.resources:
        devices = kubelet.wait_for_resource(resource.name, count=len(resource.devices), timeout=10)
        assert sorted(d["id"] for d in devices) == sorted(d.id for d in resource.devices)
    if profile == "a100-sxm-8":
        assert [r.name for r in expected.resources] == ["nvidia.com/gpu"]
        assert len(expected.resources[0].devices) == 8
    if mig_strategy == "mixed":
        assert all(r.name.startswith("nvidia.com/mig-") for r in expected.resources)
        assert {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-7g.80gb"} <= {r.name for r in expected.resources}
    stop_cleanly(plugin)


def test_time_slicing_replicas_and_xid_marks_every_replica(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                           tmp_path: Path) -> None:
    plugin, node = make_plugin("t4", CONFIG_FILE=write(tmp_path / "ts.yaml", TIME_SLICING))
    plugin.start()
    uuid = node.inventory.gpus[0].uuid
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=10, timeout=10)
    assert sorted(d["id"] for d in devices) == sorted(f"{uuid}::{n}" for n in range(10))
    plugin.wait_for_log("Health checks: ignoring XIDs [13, 31, 43, 45, 68, 109]")
    node.inject_xid(uuid, 13)  # an application error: ignored by default
    node.inject_xid(uuid, 48)
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=0, timeout=10)
    assert {d["health"] for d in devices} == {"Unhealthy"}
    # The line is written once the kubelet has the list, so it can come just after.
    plugin.wait_for_log("nvidia.com/gpu: 10 device(s) marked unhealthy (XID 48 (double-bit ECC error))")
    assert "Ignoring XID 13" in plugin.log
    stop_cleanly(plugin)


def test_lost_gpu_turns_unhealthy(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, node = make_plugin("mixed-4")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=4, timeout=10)
    plugin.wait_for_log("Health checks:")
    lost = node.inventory.gpus[2].uuid
    node.lose_gpu(lost)
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=3, timeout=10)
    assert [d["id"] for d in devices if d["health"] == "Unhealthy"] == [lost]
    stop_cleanly(plugin)


def test_disabled_health_checks_ignore_xids(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, _node = make_plugin("t4", DP_DISABLE_HEALTHCHECKS="all")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=1, timeout=10)
    plugin.wait_for_log("Health checks disabled by configuration")
    stop_cleanly(plugin)


DEVICES_DIR = "/var/run/nvidia-container-devices"
CDI_GPU = "k8s.device-plugin.nvidia.com/gpu"


def volume_mounts_ok(response: dict[str, Any], uuid: str) -> bool:
    mounts = [{"container_path": f"{DEVICES_DIR}/{uuid}", "host_path": "/dev/null"}]
    return bool(response["envs"]["NVIDIA_VISIBLE_DEVICES"] == DEVICES_DIR and response["mounts"] == mounts)


def cdi_annotations_ok(response: dict[str, Any], uuid: str) -> bool:
    annotations = response["annotations"]
    return list(annotations.values()) == [f"{CDI_GPU}={uuid}"] and all(
        k.startswith("cdi.k8s.io/nvidia-device-plugin_") for k in annotations
    )


def cdi_cri_ok(response: dict[str, Any], uuid: str) -> bool:
    return bool(response["cdi_devices"] == [{"name": f"{CDI_GPU}={uuid}"}] and "envs" not in response)


@pytest.mark.parametrize(
    ("strategy", "key", "check"),
    [
        ("volume-mounts", "mounts", volume_mounts_ok),
        ("cdi-annotations", "annotations", cdi_annotations_ok),
        ("cdi-cri", "cdi_devices", cdi_cri_ok),
    ],
)
def test_allocate_strategies(make_plugin: MakePlugin, kubelet: KubeletSim, tmp_path: Path, strategy: str,
                             key: str, check: Callable[[dict[str, Any], str], bool]) -> None:
    plugin, node = make_plugin("t4", DEVICE_LIST_STRATEGY=strategy)
    if strategy.startswith("cdi-"):  # the plugin writes the CDI spec from the driver's files first
        plugin.env.update(make_cdi_node(tmp_path / "cdi-node", node.inventory).env)
    plugin.start()
    uuid = node.inventory.gpus[0].uuid
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    (response,) = kubelet.allocate("nvidia.com/gpu", [[uuid]])["container_responses"]
    assert key in response, response
    assert check(response, uuid), response
    stop_cleanly(plugin)


def test_pass_device_specs_look_for_control_nodes_at_dev_as_nvidia_does(
        make_plugin: MakePlugin, kubelet: KubeletSim, tmp_path: Path) -> None:
    """Control nodes under the mounted driver root are not what counts: NVIDIA stats /dev/nvidiactl,
    /dev/nvidia-uvm, ... in the plugin's own container; only the host paths go under the dev root."""
    driver_root = tmp_path / "driver-root"
    (driver_root / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm"):
        (driver_root / "dev" / name).write_text("")
    plugin, node = make_plugin("t4", PASS_DEVICE_SPECS="true", DRIVER_ROOT_CTR_PATH=str(driver_root),
                               NVIDIA_DRIVER_ROOT="/run/nvidia/driver")
    plugin.start()
    gpu = node.inventory.gpus[0]
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    (response,) = kubelet.allocate("nvidia.com/gpu", [[gpu.uuid]])["container_responses"]
    paths = [(d["container_path"], d["host_path"], d["permissions"]) for d in response["devices"]]
    controls = [(p, f"/run/nvidia/driver{p}", "rw") for p in CONTROL_DEVICE_PATHS if os.path.exists(p)]
    own = (f"/dev/nvidia{gpu.minor}", f"/run/nvidia/driver/dev/nvidia{gpu.minor}", "rw")
    assert paths == [*controls, own]
    stop_cleanly(plugin)


def test_kubelet_restart_reregisters(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, _ = make_plugin("t4")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet")
    kubelet.restart()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet", count=2)
    assert len(kubelet.registrations) == 2
    stop_cleanly(plugin)


def test_kubelet_started_after_the_plugin(make_plugin: MakePlugin, plugin_dir: Path) -> None:
    plugin, _ = make_plugin("t4")
    plugin.start()
    plugin.wait_for_log("not registered with the kubelet yet")
    plugin.wait_for_log("Health checks:", timeout=5)  # no kubelet: health checking starts anyway
    assert plugin.log.count("not registered with the kubelet yet") == 1
    with KubeletSim(plugin_dir) as kubelet:
        kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
        stop_cleanly(plugin)


def test_sighup_adds_resources_and_keeps_unchanged_servers(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                           tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write(config, "version: v1\n")
    plugin, _node = make_plugin("mixed-4", CONFIG_FILE=str(config))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=4, timeout=10)
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet")
    write(config, """\
version: v1
resources:
  gpus:
    - pattern: "*T4*"
      name: t4
    - pattern: "*V100*"
      name: gpu
""")
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload applied:")
    kubelet.wait_for_resource("nvidia.com/t4", count=2, timeout=10)
    kubelet.wait_for_resource("nvidia.com/gpu", count=2, timeout=10)
    assert "Reload applied: added nvidia.com/t4; updated nvidia.com/gpu" in plugin.log
    # The server of nvidia.com/gpu was updated in place, not restarted and registered again.
    assert plugin.log.count("Starting GRPC server for 'nvidia.com/gpu'") == 1
    assert plugin.log.count("Registered device plugin for 'nvidia.com/gpu' with Kubelet") == 1

    plugin.signal(signal.SIGHUP)  # nothing changed
    plugin.wait_for_log("Reload applied:", count=2)
    assert "Reload applied: unchanged nvidia.com/gpu, nvidia.com/t4" in plugin.log
    stop_cleanly(plugin)


def test_bad_config_on_sighup_keeps_the_old_one(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write(config, TIME_SLICING)
    plugin, _ = make_plugin("t4", CONFIG_FILE=str(config))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=10, timeout=10)
    write(config, "version: v1\nflags:\n  migStrategy: sideways\n")
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload failed; still serving the previous configuration.")
    assert "migStrategy" in plugin.log.split("Reload failed")[1]
    assert len(kubelet.wait_for_resource("nvidia.com/gpu", count=10, timeout=10)) == 10
    assert plugin.proc is not None and plugin.proc.poll() is None
    stop_cleanly(plugin)


def test_huge_replicas_on_sighup_keep_the_old_config(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                     tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write(config, TIME_SLICING)
    plugin, _ = make_plugin("t4", CONFIG_FILE=str(config))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=10, timeout=10)
    write(config, TIME_SLICING.replace("replicas: 10", "replicas: 10000000000000000000000"))
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload failed; still serving the previous configuration.")
    assert "replicas: must be at most 1024" in plugin.log.split("Reload failed")[1]
    assert len(kubelet.wait_for_resource("nvidia.com/gpu", count=10, timeout=10)) == 10
    assert plugin.proc is not None and plugin.proc.poll() is None
    stop_cleanly(plugin)


def test_invalid_config_at_start_exits_1(make_plugin: MakePlugin, tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "version: v1\nflags:\n  migStrategy: x\n")
    plugin, _ = make_plugin("t4", CONFIG_FILE=bad)
    plugin.start()
    assert plugin.wait() == 1
    assert "invalid configuration (1 problem):" in plugin.log
    assert plugin.sockets() == []


def test_nvml_missing_fail_on_init_error_exits_1(make_bare_plugin: MakeBarePlugin, tmp_path: Path) -> None:
    plugin = make_bare_plugin(DRIVER_ROOT_CTR_PATH=str(tmp_path / "no-driver"))
    plugin.start()
    assert plugin.wait() == 1
    assert "NVML is not available (ERROR_LIBRARY_NOT_FOUND): libnvidia-ml.so.1 was not found" in plugin.log
    assert "Exiting: failOnInitError is true" in plugin.log
    assert "Traceback" not in plugin.log


def test_nvml_missing_without_fail_on_init_error_stays_up(make_bare_plugin: MakeBarePlugin,
                                                          tmp_path: Path) -> None:
    no_driver = str(tmp_path / "no-driver")
    plugin = make_bare_plugin(DRIVER_ROOT_CTR_PATH=no_driver, FAIL_ON_INIT_ERROR="false")
    plugin.start()
    plugin.wait_for_log("No devices found. Waiting indefinitely.")
    assert "NVML is not available (ERROR_LIBRARY_NOT_FOUND)" in plugin.log
    plugin.signal(signal.SIGHUP)  # still no NVML: keeps waiting
    plugin.wait_for_log("Reload failed; still serving the previous configuration.")
    assert plugin.stop() == 0
    assert "Traceback" not in plugin.log
