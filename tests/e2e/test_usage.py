"""Who uses which GPU, on a real node: each pod's GPU memory and SM utilization in both plugins' /metrics
and in `nvdp usage`, the stand-in NVML's processes pointed at the pods' real PIDs.

1. Device-plugin mode: the chart with `metrics.usage.enabled` and the T4 shared by time-slicing x4; two
   pods on it, their processes (their containers' PIDs, as the host sees them) given memory and SM
   utilization, plus a process of no pod. Scraped from the plugin pod's endpoint as Prometheus does:
   each pod's series show its own figures and no other pod's, in dcgm-exporter's labels; `nvdp usage -o
   json` in the plugin's pod shows the same; a pod deleted is gone from the next scrape.
2. DRA mode: the chart with `dra.enabled` (the CDI scenario's fake driver root, the T4 time-sliced x10),
   two claim pods on gpu-0, the same checks with the claims' labels, from the DRA plugin's /metrics and
   `nvdp usage` in its pod.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .e2e_cluster import (
    DATA,
    SIM_STATE_DIR,
    SIM_STATE_MOUNT,
    Cluster,
    Images,
    Release,
    Timings,
    gpu_pod,
    story_release,
)
from .test_cdi import T4_UUID, HostSetup
from .test_dra import claim_host, claim_pod, claim_template, diagnose, plugin_log, pod_phase, values

SCENARIO = "GPU usage by pod"
pytestmark = pytest.mark.incremental
WORK = "nvdp-e2e-usage-work"
DRA_WORK = "nvdp-e2e-dra-work"  # test_dra's claim helpers put claims and pods there
MIB = 1 << 20
USAGE = ("--set", "metrics.enabled=true", "--set", "metrics.usage.enabled=true")
# Two pods' processes: (memory, SM %) each; one process of no pod (a host process) beside them.
FIGURES = {"a": (700 * MIB, 30), "b": (300 * MIB, 55)}
HOST_PID = 1  # the node's init: in no pod's cgroup


def set_processes(cluster: Cluster, processes: list[dict[str, Any]]) -> None:
    """What the stand-in NVML lists on the T4 (sim/nvml/README.md, "Running processes")."""
    path = f"{SIM_STATE_DIR}/processes/{T4_UUID}"
    if not processes:
        cluster.host(f"rm -f {path}")
        return
    text = shlex.quote(json.dumps(processes))
    cluster.host(f"mkdir -p {SIM_STATE_DIR}/processes && printf '%s' {text} > {path}.tmp "
                 f"&& mv {path}.tmp {path}")


def host_pid(cluster: Cluster, namespace: str, pod: str) -> int:
    """The host's PID of the pod's (only) container's process, found by its container ID in the cgroups."""
    status = cluster.kubectl_json("get", "pod", "-n", namespace, pod)["status"]
    container_id = status["containerStatuses"][0]["containerID"].split("://", 1)[1]
    found = cluster.host(f"grep -l {container_id} /proc/[0-9]*/cgroup 2>/dev/null || true").stdout.split()
    pids = sorted(int(path.split("/")[2]) for path in found)
    assert pids, f"no process of container {container_id} ({namespace}/{pod}) on the node"
    return pids[0]


def point_processes_at(cluster: Cluster, namespace: str, pods: dict[str, str]) -> dict[str, int]:
    """The stand-in's processes: one per pod (its real PID) with its figures, and a host process."""
    pids = {short: host_pid(cluster, namespace, name) for short, name in pods.items()}
    running = [{"pid": pids[short], "usedGpuMemory": FIGURES[short][0], "smUtil": FIGURES[short][1]}
               for short in pods]
    set_processes(cluster, [*running, {"pid": HOST_PID, "usedGpuMemory": 64 * MIB}])
    return pids


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(cluster: Cluster, pod: dict[str, Any], port: int = 9445) -> Samples:
    text = cluster.host(f"curl -sS --max-time 10 http://{pod['status']['podIP']}:{port}/metrics").stdout
    return {family.name: [(dict(s.labels), s.value) for s in family.samples]
            for family in text_string_to_metric_families(text)}


def by_pod(found: Samples, name: str) -> dict[str, tuple[dict[str, str], float]]:
    return {labels["pod"]: (labels, value) for labels, value in found.get(name, [])}


def usage_json(cluster: Cluster, release: Release, component: str) -> dict[str, Any]:
    (pod,) = release.pods(component)
    container = pod["spec"]["containers"][0]["name"]
    text = cluster.kubectl("exec", "-n", release.namespace, pod["metadata"]["name"], "-c", container, "--",
                           "nvdp", "usage", "-o", "json", check=False)
    assert text.returncode == 0, text.stderr
    found: dict[str, Any] = json.loads(text.stdout)
    return found


def check_figures(found: Samples, names: dict[str, str], namespace: str,
                  container: str) -> dict[str, dict[str, str]]:
    """Each pod's two series carry its own figures, its own labels, and no other pod is there."""
    memory = by_pod(found, "nvdp_pod_gpu_memory_used_bytes")
    util = by_pod(found, "nvdp_pod_gpu_sm_utilization_percent")
    assert set(memory) == set(util) == set(names.values()), (memory, util)
    labels = {}
    for short, name in names.items():
        assert memory[name][1] == FIGURES[short][0], (name, memory[name])
        assert util[name][1] == FIGURES[short][1], (name, util[name])
        seen = memory[name][0]
        assert (seen["namespace"], seen["container"], seen["UUID"], seen["gpu"], seen["device"]) == (
            namespace, container, T4_UUID, "0", "nvidia0"), seen
        assert seen["modelName"] == "Tesla T4" and seen["pod_uid"], seen
        labels[name] = seen
    (others,) = found["nvdp_gpu_unattributed_processes"]
    assert others[1] == 1.0  # the host process
    assert found["nvdp_usage_collection_problems"][0][1] == 0.0
    return labels


def check_cli(usage: dict[str, Any], names: dict[str, str]) -> None:
    (device,) = usage["devices"]
    assert device["uuid"] == T4_UUID and device["otherProcesses"] == 1
    assert {p["pod"]: (p["memoryBytes"], p["smUtilization"]) for p in device["pods"]} == {
        name: FIGURES[short] for short, name in names.items()}
    assert usage["problems"] == []


def wait_gone(cluster: Cluster, release: Release, component: str, pod: str) -> None:
    """The first scrape after the pod is gone from the API (its containers ended) no longer has it."""
    (plugin,) = release.pods(component)
    assert pod not in by_pod(scrape(cluster, plugin), "nvdp_pod_gpu_memory_used_bytes")


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        yield setup
    set_processes(cluster, [])


def test_device_plugin_pods_time_sharing_a_gpu_each_see_their_own(
        cluster: Cluster, images: Images, timings: Timings) -> None:
    # The release goes at the end of this step (its pods with it), before the DRA plugin's is installed.
    with story_release(cluster, images, "nvdp-usage", "nvdp-e2e-usage", work=[WORK]) as release:
        try:
            device_plugin_story(cluster, release, images, timings)
        finally:
            set_processes(cluster, [])


def device_plugin_story(cluster: Cluster, dp_release: Release, images: Images, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (time-slicing x4, metrics.usage.enabled)"):
        dp_release.install(*USAGE, *SIM_STATE_MOUNT, "--set-file",
                           f"config.map.config={DATA / 'time-slicing-4.yaml'}")
    cluster.wait_allocatable(4, namespace=dp_release.namespace)
    (plugin,) = dp_release.pods("device-plugin")
    assert plugin["spec"]["hostPID"] is True
    names = {"a": "usage-a", "b": "usage-b"}
    for name in names.values():
        cluster.apply({**gpu_pod(name, images.plugin), "metadata": {"name": name, "namespace": WORK}})
    cluster.wait_for("both pods Running", lambda: all(
        cluster.kubectl_json("get", "pod", "-n", WORK, name)["status"].get("phase") == "Running"
        for name in names.values()), 90)
    point_processes_at(cluster, WORK, names)
    with timings.measure(SCENARIO, "device plugin: scrape with two pods' usage"):
        found = scrape(cluster, plugin)
    labels = check_figures(found, names, WORK, "cuda")
    assert all(not seen["dra_claim_name"] for seen in labels.values())
    check_cli(usage_json(cluster, dp_release, "device-plugin"), names)
    with timings.measure(SCENARIO, "device plugin: pod deleted (grace 0) -> gone from the next scrape"):
        cluster.kubectl("delete", "pod", "-n", WORK, names["b"], "--grace-period=0", "--wait=true",
                        timeout=90)
        wait_gone(cluster, dp_release, "device-plugin", names["b"])
    assert set(by_pod(scrape(cluster, plugin), "nvdp_pod_gpu_memory_used_bytes")) == {names["a"]}


@pytest.fixture(scope="module")
def dra_release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images, "nvdp-usage-dra", "nvdp-e2e-usage-dra", work=[DRA_WORK]) as release:
        yield release
    set_processes(cluster, [])


def test_dra_claim_pods_sharing_a_gpu_each_see_their_own(
        cluster: Cluster, dra_release: Release, host: HostSetup, images: Images, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (dra.enabled, time-slicing x10, metrics.usage)"):
        done = dra_release.install(*values(host), *USAGE, "--set-file",
                                   f"config.map.config={DATA / 'dra-time-slicing-10.yaml'}", check=False)
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{plugin_log(cluster, dra_release)}"
    cluster.wait_for("the kubelet's registration", lambda: "Registered with the kubelet" in plugin_log(
        cluster, dra_release), 60, diagnose=lambda: plugin_log(cluster, dra_release))
    (plugin,) = dra_release.pods("dra-plugin")
    assert plugin["spec"]["hostPID"] is True
    cluster.apply(claim_template("usage-gpu"))
    names = {"a": "usage-claim-a", "b": "usage-claim-b"}
    for name in names.values():
        cluster.apply(claim_pod(name, images.plugin, "usage-gpu"))
    for name in names.values():
        def ready(pod: str = name) -> bool:
            return pod_phase(cluster, pod) == "Ready"

        cluster.wait_for(f"pod {name} Ready", ready, 120, diagnose=diagnose(cluster, dra_release, name))
    point_processes_at(cluster, DRA_WORK, names)
    with timings.measure(SCENARIO, "DRA plugin: first scrape with two claim pods (their claims read)"):
        found = scrape(cluster, plugin)
    labels = check_figures(found, names, DRA_WORK, "cuda")
    for name, seen in labels.items():
        pod = cluster.kubectl_json("get", "pod", "-n", DRA_WORK, name)
        claim = pod["status"]["resourceClaimStatuses"][0]
        assert (seen["dra_claim_namespace"], seen["dra_claim_name"], seen["dra_driver_name"],
                seen["dra_device_name"], seen["dra_pool_name"]) == (
            DRA_WORK, claim["resourceClaimName"], "gpu.nvidia.com", "gpu-0", cluster.node), seen
    check_cli(usage_json(cluster, dra_release, "dra-plugin"), names)
    with timings.measure(SCENARIO, "DRA plugin: pod deleted (grace 0) -> gone from the next scrape"):
        cluster.kubectl("delete", "pod", "-n", DRA_WORK, names["b"], "--grace-period=0", "--wait=true",
                        timeout=90)
        wait_gone(cluster, dra_release, "dra-plugin", names["b"])
