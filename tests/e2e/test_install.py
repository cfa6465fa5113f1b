"""Plain installs on a real node: defaults, helm test, a bad config, and what uninstall leaves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .e2e_cluster import DATA, Cluster, Images, Release, Timings

SCENARIO = "default install"


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true"})
    release = Release(cluster, images, "nvdp", "nvdp-e2e-default")
    yield release
    release.uninstall()
    cluster.label({"nvidia.com/gpu.present": None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def test_default_install_advertises_the_t4(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait"):
        done = release.install()
    assert "nvidia.com/gpu.present=true" in done.stdout, "NOTES name the label the default affinity accepts"
    assert "Matching nodes in the cluster now: 1 of 1." in done.stdout, "NOTES count the matching nodes"
    timings.add(
        SCENARIO, "installed -> allocatable 1", cluster.wait_allocatable(1, namespace=release.namespace)
    )
    # Ready through the kubelet's HTTP probe of the pod's IP on the pod network (every 10 s).
    (pod,) = release.pods("device-plugin")
    assert not pod["spec"].get("hostNetwork") and pod["status"]["podIP"] != pod["status"]["hostIP"]
    (container,) = [c for c in pod["spec"]["containers"] if c.get("readinessProbe")]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    seconds = release.wait_ready()
    timings.add(SCENARIO, "allocatable 1 -> Ready (kubelet's HTTP probe)", seconds)


def test_helm_test_passes(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm test (stand-in nvidia-smi -L)"):
        done = cluster.helm("test", release.name, "-n", release.namespace, "--logs", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU 0: Tesla T4" in done.stdout + done.stderr


def test_uninstall_leaves_nothing(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm uninstall --wait"):
        release.uninstall()
    _, seconds = cluster.wait_for("the release's pods to go", lambda: not release.pods(), timeout=60)
    timings.add(SCENARIO, "uninstalled -> no pods", seconds)
    left = cluster.kubectl("get", "all,configmaps,serviceaccounts,networkpolicies", "-n", release.namespace,
                           "-l", release.selector, "-o", "name").stdout  # fmt: skip
    assert left.strip() == ""
    sockets = cluster.host("ls /var/lib/kubelet/device-plugins").stdout.split()
    assert [s for s in sockets if s != "kubelet.sock" and not s.startswith("kubelet_internal")] == []
    cluster.wait_for("allocatable nvidia.com/gpu back to 0", lambda: cluster.allocatable() in (0, None), 60)


def test_bad_config_is_refused_at_install(cluster: Cluster, images: Images, timings: Timings) -> None:
    release = Release(cluster, images, "nvdp-bad", "nvdp-e2e-bad")
    with timings.measure("bad config", "helm install refused"):
        done = release.install("--set-file", f"config.map.config={DATA / 'bad-config.yaml'}", check=False)
    assert done.returncode != 0
    wanted = 'unknown key "migstrategy" under "flags". Did you mean flags.migStrategy?'
    assert wanted in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not cluster.kubectl(
        "get", "pods", "-n", release.namespace, "-o", "name", check=False
    ).stdout.strip()
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)
