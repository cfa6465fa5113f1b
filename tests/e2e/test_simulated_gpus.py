"""The chart's unsupported.simulatedGpus on a real node, as docs/kind.md has a user type it.

The release names only the project's image repositories and tag and the node profile; the chart picks the
stand-in images (`<repository>-sim`, what the suite built, with every profile) for every pod and the helm
test, shows each container the profile through its environment, says so in NOTES.txt and labels its
pods. The node advertises the profile's GPUs and `helm test` lists them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from nvdp.config.loader import load_config
from nvdp.inventory.profile import load_profile
from nvdp.plan import plan
from sim.nvml import resolve_profile

from .e2e_cluster import ROOT, Cluster, Images, Release, Timings

sys.path.insert(0, str(ROOT / "scripts"))
import kit_images

SCENARIO = "simulated GPUs (unsupported.simulatedGpus)"
NAME, NAMESPACE = "nvdp-sim", "nvdp-e2e-sim"
LABEL = "unsupported-simulated-gpus"


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true"})
    release = Release(cluster, images, NAME, NAMESPACE)
    try:
        yield release
    finally:
        release.uninstall()
        cluster.label({"nvidia.com/gpu.present": None})
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture(scope="module")
def installed(release: Release) -> str:
    # Release.install passes what a user types: image.repository and mpsImage.repository without `-sim`,
    # their tags and unsupported.simulatedGpus=<profile> (Images.helm_args).
    return release.install().stdout


def test_the_node_advertises_the_profiles_gpus(cluster: Cluster, release: Release, installed: str,
                                               timings: Timings) -> None:
    profile = release.images.profile
    assert f"WARNING: UNSUPPORTED, SIMULATED GPUS (unsupported.simulatedGpus={profile})" in installed
    planned = plan(load_config(None, {}), load_profile(resolve_profile(profile)))
    (gpus,) = [len(r.devices) for r in planned.resources if r.name == "nvidia.com/gpu"]
    seconds = cluster.wait_allocatable(gpus, namespace=NAMESPACE)
    timings.add(SCENARIO, f"installed -> allocatable {gpus}", seconds)
    pods = release.pods()
    assert pods
    wanted = kit_images.profile_env(profile)
    for pod in pods:
        assert pod["metadata"]["labels"][LABEL] == profile
        for container in pod["spec"]["containers"]:
            assert container["image"] in (release.images.plugin, release.images.mps_daemon), container
            env = {e["name"]: e.get("value") for e in container.get("env") or []}
            assert {k: env.get(k) for k in wanted} == wanted, container["name"]


def test_helm_test_lists_the_simulated_gpus(cluster: Cluster, installed: str, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm test (the stand-in image's nvidia-smi -L)"):
        done = cluster.helm("test", NAME, "-n", NAMESPACE, "--logs", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU 0: " in done.stdout + done.stderr
