"""Health recovery on a real node: a GPU taken away by an XID comes back by itself when it is fine.

The plugin (quiet period 20 s: longer than the kubelet's node-status period, so that allocatable 0 is
seen through the API at all; at most 2 downs an hour) and GPU feature discovery run from the chart.
A transient XID takes allocatable to 0 and it returns with no one touching the node; an uncontained
ECC error keeps the GPU down, labelled as needing service, until the stand-in NVML shows the GPU reset;
a third down within the hour holds it, and `nvdp health clear` in the plugin's pod brings it back.
A GPU pod created while the GPU is down waits, and runs once the GPU is back; a running one is left
alone when its GPU goes down. Each step is seen where users see it: the Node's allocatable, its
Events, its labels and the pods.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import SIM_STATE_MOUNT, Cluster, Images, Release, Timings, gpu_pod

pytestmark = pytest.mark.incremental
SCENARIO = "health recovery"
WAITER = "health-waiter"  # a GPU pod created while the GPU is down
T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
N = "nvidia.com/"
UNHEALTHY, NEEDS_SERVICE = N + "gpu.unhealthy", N + "gpu.needs-service"
VALUES = ("--set", "devicePlugin.healthRecovery.after=20s",
          "--set", "devicePlugin.healthRecovery.flapLimit=2",
          "--set", "gfd.enabled=true",
          "--set", "events.enabled=true", *SIM_STATE_MOUNT)


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true"})
    release = Release(cluster, images, "nvdp-health", "nvdp-e2e-health")
    yield release
    cluster.kubectl("delete", "pod", WAITER, "--wait=false", "--ignore-not-found", check=False)
    release.uninstall()
    cluster.label({"nvidia.com/gpu.present": None, UNHEALTHY: None, NEEDS_SERVICE: None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def node_event(cluster: Cluster, reason: str, text: str) -> dict[str, Any] | None:
    selector = f"involvedObject.kind=Node,involvedObject.name={cluster.node},reason={reason}"
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "events", "-A", "--field-selector",
                                                       selector)["items"]
    return next((e for e in items if text in e["message"]), None)


def labels(cluster: Cluster) -> dict[str, str]:
    found: dict[str, Any] = cluster.node_object()["metadata"].get("labels", {})
    return {k: str(v) for k, v in found.items() if k in (UNHEALTHY, NEEDS_SERVICE)}


def stays_at(cluster: Cluster, release: Release, count: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert cluster.allocatable() == count, f"allocatable left {count}"
        time.sleep(1)


def waiter(cluster: Cluster) -> dict[str, Any]:
    pod: dict[str, Any] = cluster.kubectl_json("get", "pod", WAITER)
    return pod


def unschedulable(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Pending" and not pod["spec"].get("nodeName") and any(
        c.get("reason") == "Unschedulable" for c in pod["status"].get("conditions", []))


def running(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or [{}]
    return pod["status"].get("phase") == "Running" and "running" in statuses[0].get("state", {})


def plugin_pod(release: Release) -> str:
    (pod,) = release.pods("device-plugin")
    return str(pod["metadata"]["name"])


def test_install_with_health_recovery(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (healthRecovery.after=20s, gfd and events on)"):
        release.install(*VALUES)
    cluster.wait_allocatable(1, namespace=release.namespace)
    (pod,) = release.pods("device-plugin")
    env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env", [])}
    assert env["HEALTH_RECOVERY_AFTER"] == "20s" and env["HEALTH_STATE_DIR"] == "/run/nvidia/nvdp"


def test_a_transient_xid_comes_back_by_itself(cluster: Cluster, release: Release, timings: Timings) -> None:
    start = time.monotonic()
    cluster.inject_xid(T4, 94)
    timings.add(SCENARIO, "XID 94 -> allocatable 0", cluster.wait_allocatable(0, namespace=release.namespace))
    cluster.wait_allocatable(1, timeout=60, namespace=release.namespace)
    timings.add(SCENARIO, "XID 94 -> allocatable 1 again (quiet period 20 s)", time.monotonic() - start)
    down = "XID 94 (contained ECC error); it comes back by itself after 20s"
    assert node_event(cluster, "GPUUnhealthy", down) is not None
    healthy = f"{T4} is healthy again"
    cluster.wait_for("the GPUHealthy Event", lambda: node_event(cluster, "GPUHealthy", healthy), 30)


def test_an_uncontained_ecc_error_waits_for_a_reset(cluster: Cluster, release: Release, images: Images,
                                                    timings: Timings) -> None:
    cluster.sim_gpu_state("ecc-volatile", T4, "1")
    cluster.inject_xid(T4, 95)
    cluster.wait_allocatable(0, namespace=release.namespace)
    wanted = {UNHEALTHY: "1", NEEDS_SERVICE: "1"}
    _, seconds = cluster.wait_for("the health labels", lambda: labels(cluster) == wanted or None, 60)
    timings.add(SCENARIO, "XID 95 -> GFD labels gpu.unhealthy=1, gpu.needs-service=1", seconds)
    # A pod asking for the GPU while it is down is not given it.
    cluster.apply(gpu_pod(WAITER, images.plugin))
    stays_at(cluster, release, 0, 30)  # past the quiet period: time alone does not bring it back
    assert unschedulable(waiter(cluster)), waiter(cluster)["status"]
    shown = cluster.exec(release.namespace, plugin_pod(release), "nvdp", "health")
    assert f"{T4}  needs-reset" in shown and "XID 95 (uncontained ECC error)" in shown, shown
    start = time.monotonic()
    cluster.sim_gpu_state("ecc-volatile", T4, "0")  # what a GPU reset does to the volatile count
    cluster.wait_allocatable(1, timeout=60, namespace=release.namespace)
    timings.add(SCENARIO, "GPU reset -> allocatable 1", time.monotonic() - start)
    cluster.wait_for("the waiting pod to run", lambda: running(waiter(cluster)) or None, 60)
    timings.add(SCENARIO, "GPU reset -> the waiting GPU pod Running", time.monotonic() - start)
    cluster.wait_for("the health labels to go", lambda: labels(cluster) == {} or None, 60)
    assert node_event(cluster, "GPUHealthy", "NVML shows it was reset") is not None


def test_a_third_down_within_the_hour_holds_the_gpu_until_cleared(cluster: Cluster, release: Release,
                                                                  timings: Timings) -> None:
    cluster.inject_xid(T4, 94)
    cluster.wait_allocatable(0, namespace=release.namespace)
    flapping = "went Unhealthy 3 times within the last hour"
    cluster.wait_for("the GPUFlapping Event", lambda: node_event(cluster, "GPUFlapping", flapping), 30)
    stays_at(cluster, release, 0, 25)
    # The pod that runs on the GPU is left alone while the GPU is down.
    pod = waiter(cluster)
    assert running(pod) and pod["status"]["containerStatuses"][0]["restartCount"] == 0, pod["status"]
    cluster.kubectl("delete", "pod", WAITER, "--wait=false")
    out = cluster.exec(release.namespace, plugin_pod(release), "nvdp", "health", "clear", T4)
    assert out.startswith(f"Cleared {T4}: "), out
    timings.add(SCENARIO, "nvdp health clear -> allocatable 1",
                cluster.wait_allocatable(1, timeout=30, namespace=release.namespace))
    cluster.wait_for("the GPUCleared Event", lambda: node_event(cluster, "GPUCleared", T4), 30)
