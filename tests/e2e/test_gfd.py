"""Seed 004 with GPU feature discovery on a real node: MPS x10 with nobody typing `kubectl label`.

The user's own values (affinity serverType=gpu, which their nodes carry) and MPS config, plus
gfd.enabled: the labeller sets nvidia.com/mps.capable=true, the MPS daemon is scheduled, the plugin
reaches 10. Then the config switches to time-slicing and the label follows.

The labeller runs on the pod network, as users install it, and reaches the API server through the
`kubernetes` Service (its in-cluster config).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import DATA, Cluster, Images, Release, Timings

SCENARIO = "seed 004 + gfd.enabled"
pytestmark = pytest.mark.incremental
N = "nvidia.com/"
MPS_LABEL = N + "mps.capable"
GFD_ON = ("--set", "gfd.enabled=true")


def gfd_labels(cluster: Cluster) -> dict[str, str]:
    labels: dict[str, Any] = cluster.node_object()["metadata"].get("labels", {})
    return {k: str(v) for k, v in labels.items() if k.startswith(N)}


def owned_labels_none(cluster: Cluster) -> dict[str, str | None]:
    """Every label GPU feature discovery owns on the node, mapped to None (for clean-up)."""
    from nvdp.gfd.reconcile import owns

    return {k: None for k in gfd_labels(cluster) if owns(k)}


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"serverType": "gpu", MPS_LABEL: None})
    cluster.label(owned_labels_none(cluster) or {MPS_LABEL: None})
    release = Release(cluster, images, "nvdp", "nvdp-e2e-gfd")
    yield release
    release.uninstall()
    cluster.label({"serverType": None, **owned_labels_none(cluster)} | {MPS_LABEL: None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def test_install_reaches_10_with_no_hand_label(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (seed values + gfd.enabled)"):
        config = f"config.map.config={DATA / 'seed-004-config.yaml'}"
        done = release.install("-f", str(DATA / "seed-004-values.yaml"), "--set-file", config, *GFD_ON)
    # NOTES show the per-node config label command with any config; no hand label for MPS with GFD on.
    assert "kubectl label node <node> nvidia.com/mps.capable" not in done.stdout, "NOTES ask for a hand label"
    (labeller,) = release.pods("gpu-feature-discovery")
    assert not labeller["spec"].get("hostNetwork"), "the labeller runs on the pod network"
    seconds = cluster.wait_allocatable(10, timeout=180, namespace=release.namespace)
    timings.add(SCENARIO, "installed -> allocatable 10 (GFD labels, MPS daemon starts)", seconds)
    labels = gfd_labels(cluster)
    assert labels[MPS_LABEL] == "true"
    assert labels[N + "gpu.product"] == "Tesla-T4-SHARED"
    assert labels[N + "gpu.replicas"] == "10"
    assert labels[N + "gpu.sharing-strategy"] == "mps"
    assert labels[N + "gpu.count"] == "1"
    assert labels[N + "gpu.family"] == "turing"
    (daemon,) = release.pods("mps-control-daemon")
    assert daemon["status"]["phase"] == "Running"
    log = release.logs("gpu-feature-discovery")
    assert "labels changed" in log and "Traceback" not in log, log


def test_switch_to_time_slicing_sets_mps_capable_false(
    cluster: Cluster, release: Release, timings: Timings
) -> None:
    with timings.measure(SCENARIO, "helm upgrade to time-slicing x4 --wait"):
        config = f"config.map.config={DATA / 'time-slicing-4.yaml'}"
        release.upgrade("-f", str(DATA / "seed-004-values.yaml"), "--set-file", config, *GFD_ON)
    cluster.refresh_config_volumes(release.namespace, release.selector)

    def relabelled() -> dict[str, str] | None:
        labels = gfd_labels(cluster)
        return labels if labels.get(MPS_LABEL) == "false" and labels.get(N + "gpu.replicas") == "4" else None

    labels, seconds = cluster.wait_for("mps.capable=false, replicas 4", relabelled, timeout=120,
                                       diagnose=lambda: release.logs("gpu-feature-discovery"))  # fmt: skip
    timings.add(SCENARIO, "upgraded -> labels follow (mps.capable=false)", seconds)
    assert labels[N + "gpu.sharing-strategy"] == "time-slicing"
    timings.add(
        SCENARIO, "upgraded -> allocatable 4", cluster.wait_allocatable(4, namespace=release.namespace)
    )
