"""Beside the GPU Operator on a real node: its mig-manager and driver-manager pause third-party GPU
clients by setting the node label nvidia.com/gpu.deploy.client to paused-for-mig-change or
paused-for-driver-upgrade, and the plugin's DaemonSet (gpuOperator.respectDeployLabel, the default)
runs only where that label is "true" or absent. So the label stops the plugin pod (the kubelet then
drops the GPU from allocatable) and setting it back to "true", or removing it, brings the plugin
back with allocatable restored.

The release has one config entry (`--set-file config.map.config=`), which needs no API access: the
plugin pod runs without a service account token and serves all the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .e2e_cluster import DATA, Cluster, Images, Release, Timings

SCENARIO = "GPU Operator pause (gpu.deploy.client)"
pytestmark = pytest.mark.incremental
DEPLOY = "nvidia.com/gpu.deploy.client"
PRESENT = "nvidia.com/gpu.present"


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({PRESENT: "true", DEPLOY: None})
    release = Release(cluster, images, "nvdp", "nvdp-e2e-operator-pause")
    yield release
    release.uninstall()
    cluster.label({PRESENT: None, DEPLOY: None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def plugin_pod_uid(release: Release) -> str | None:
    """The plugin pod's UID once it is Running (None while there is none, or it is going)."""
    pods = [p for p in release.pods("device-plugin")
            if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]
    return pods[0]["metadata"]["uid"] if len(pods) == 1 else None


def desired(cluster: Cluster, release: Release) -> int:
    """How many plugin pods the DaemonSet controller wants: 0 where no node matches its affinity."""
    name = f"{release.name}-nvidia-device-plugin"
    status = cluster.kubectl_json("get", "daemonset", name, "-n", release.namespace)["status"]
    return int(status.get("desiredNumberScheduled", 0))


def test_install_with_one_entry_serves_without_a_token(
    cluster: Cluster, release: Release, timings: Timings
) -> None:
    with timings.measure(SCENARIO, "helm install --wait (one config entry)"):
        release.install("--set-file", f"config.map.config={DATA / 'plain.yaml'}")
    timings.add(SCENARIO, "installed -> allocatable 1",
                cluster.wait_allocatable(1, namespace=release.namespace))  # fmt: skip
    (pod,) = release.pods("device-plugin")
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    mounts = [m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])]
    assert not [m for m in mounts if m.startswith("/var/run/secrets")], mounts
    assert not cluster.kubectl("get", "clusterroles,clusterrolebindings", "-l", release.selector,
                               "-o", "name").stdout.strip()  # fmt: skip
    # The plugin knows why it cannot read its Node's label, and says so without failing.
    cluster.wait_for("the plugin to say it has no token",
                     lambda: "no service account token" in release.logs(), 30, every=1, diagnose=release.logs)
    # The affinity the operator's label is read through: "true" or absent. (The DaemonSet's, as the
    # controller gives each pod a term naming its node instead.)
    ds = cluster.kubectl_json("get", "daemonset", f"{release.name}-nvidia-device-plugin",
                              "-n", release.namespace)
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {(e["key"], e["operator"]) for t in terms for e in t.get("matchExpressions", [])}
    assert {(DEPLOY, "In"), (DEPLOY, "DoesNotExist")} <= keys


@pytest.mark.parametrize(("paused", "resumed"), [("paused-for-mig-change", "true"),
                                                 ("paused-for-driver-upgrade", None)],
                         ids=["mig-change-then-true", "driver-upgrade-then-removed"])
def test_a_paused_node_stops_the_plugin_and_resuming_brings_it_back(
    cluster: Cluster, release: Release, timings: Timings, paused: str, resumed: str | None
) -> None:
    before = plugin_pod_uid(release)
    assert before is not None and cluster.allocatable() == 1

    start = time.monotonic()
    cluster.label({DEPLOY: paused})
    cluster.wait_for("the plugin pod to go", lambda: not release.pods("device-plugin"), 90,
                     diagnose=lambda: str(release.pods("device-plugin")))  # fmt: skip
    timings.add(SCENARIO, f"label {paused} -> plugin pod gone", time.monotonic() - start)
    # Gone because no node matches any more, not because it failed: the controller wants none.
    assert desired(cluster, release) == 0
    cluster.wait_allocatable(0)
    timings.add(SCENARIO, f"label {paused} -> allocatable 0", time.monotonic() - start)

    start = time.monotonic()
    cluster.label({DEPLOY: resumed})
    after, _ = cluster.wait_for("a new plugin pod Running", lambda: plugin_pod_uid(release), 90,
                                diagnose=lambda: str(release.pods("device-plugin")))  # fmt: skip
    assert after != before
    label = "removed" if resumed is None else resumed
    timings.add(SCENARIO, f"label {label} -> plugin pod Running", time.monotonic() - start)
    cluster.wait_allocatable(1, namespace=release.namespace)
    timings.add(SCENARIO, f"label {label} -> allocatable 1", time.monotonic() - start)
    assert desired(cluster, release) == 1


def test_false_keeps_the_plugin_away_too(cluster: Cluster, release: Release, timings: Timings) -> None:
    """The operator disables its clients on a node with "false"; only "true" or no label run them."""
    start = time.monotonic()
    cluster.label({DEPLOY: "false"})
    cluster.wait_for("the plugin pod to go", lambda: not release.pods("device-plugin"), 90)
    timings.add(SCENARIO, "label false -> plugin pod gone", time.monotonic() - start)
    assert desired(cluster, release) == 0
    cluster.wait_allocatable(0)
    start = time.monotonic()
    cluster.label({DEPLOY: None})
    cluster.wait_for("a new plugin pod Running", lambda: plugin_pod_uid(release), 90)
    cluster.wait_allocatable(1, namespace=release.namespace)
    timings.add(SCENARIO, "label removed (after false) -> allocatable 1", time.monotonic() - start)

