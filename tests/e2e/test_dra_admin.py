"""DRA admin access (KEP-5018, GA in Kubernetes 1.36) on a real node: a debug pod gets the GPU a claim holds.

The chart installed with `dra.enabled=true` as in tests/e2e/test_dra.py (one stand-in T4, the CDI
scenario's fake driver root for the claim specs). The story, each step on the one before:
1. a pod with an ordinary claim for one gpu.nvidia.com device is Running.
2. in a namespace labelled `resource.kubernetes.io/admin-access: "true"`, a pod whose claim's request has
   `adminAccess: true` and the same device class is allocated the same GPU (the result says
   `adminAccess: true`), prepared beside the holder and Running: it sees /dev/nvidia0 and its own claim
   spec; the holder keeps running and keeps its spec.
3. a third, ordinary claim stays Pending: the admin claim never freed nor took a second share of the GPU.
4. the admin pod deleted: its claim is unprepared (its spec goes) while the holder's spec stays.
5. the other order: with the GPU free, an admin pod runs first; an ordinary claim pod then gets the GPU
   and runs too (the admin claim holds nothing on the node either: no "already prepared" refusal).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import Cluster, Images, Release, Timings, story_release
from .test_cdi import HostSetup
from .test_dra import CLAIM_SPEC_PREFIX, DRIVER, claim_host, plugin_log, slice_devices, values

SCENARIO = "DRA admin access"
pytestmark = pytest.mark.incremental
WORK = "nvdp-e2e-dra-admin-work"
DEBUG = "nvdp-e2e-dra-admin-debug"  # labelled for admin access
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
POD_READY_S = 120


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        yield setup


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images, "nvdp-dra-admin", "nvdp-e2e-dra-admin",
                       work=[WORK, DEBUG]) as release:
        cluster.kubectl("label", "namespace", DEBUG, f"{ADMIN_LABEL}=true", "--overwrite")
        yield release


# --- objects ------------------------------------------------------------------------------------------


def gpu_claim(namespace: str, name: str, admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if admin:
        exactly["adminAccess"] = True
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }  # fmt: skip


def claim_pod(namespace: str, name: str, image: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"], "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


# --- reading the cluster -----------------------------------------------------------------------------


def phase(cluster: Cluster, namespace: str, name: str) -> str:
    pod = cluster.kubectl_json("get", "pod", "-n", namespace, name)
    conditions = pod["status"].get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return "Ready" if ready else str(pod["status"].get("phase"))


def claim_object(cluster: Cluster, namespace: str, name: str) -> Any:
    return cluster.kubectl_json("get", "resourceclaim", "-n", namespace, name)


def spec_exists(cluster: Cluster, uid: str) -> bool:
    return cluster.host(f"test -e {CLAIM_SPEC_PREFIX}{uid}.json", check=False).returncode == 0


def seen_in_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    script = ("import json, os\n"
              "gpus = sorted(n for n in os.listdir('/dev') if n.startswith('nvidia') and n[6:].isdigit())\n"
              "print(json.dumps({'env': dict(os.environ), 'gpus': gpus}))")
    seen: dict[str, Any] = json.loads(cluster.exec(namespace, name, "python", "-c", script))
    return seen


def diagnose(cluster: Cluster, release: Release, namespace: str, pod: str) -> Any:
    def text() -> str:
        events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
        described = cluster.kubectl("get", "pod", "-n", namespace, pod, "-o", "yaml", check=False).stdout
        claims = cluster.kubectl("get", "resourceclaims", "-A", "-o", "yaml", check=False).stdout
        return f"{described}\n{events}\n{claims}\n{plugin_log(cluster, release)}"
    return text


def run_ready(cluster: Cluster, release: Release, namespace: str, name: str) -> float:
    _, seconds = cluster.wait_for(f"pod {namespace}/{name} Ready",
                                  lambda: phase(cluster, namespace, name) == "Ready", POD_READY_S,
                                  diagnose=diagnose(cluster, release, namespace, name))
    return seconds


# --- the story ----------------------------------------------------------------------------------------


def test_install_and_a_claim_holds_the_gpu(cluster: Cluster, release: Release, images: Images,
                                           host: HostSetup, timings: Timings) -> None:
    done = release.install(*values(host), check=False)
    log = plugin_log(cluster, release) if done.returncode else ""
    assert done.returncode == 0, f"helm install failed:\n{done.stderr[-2000:]}\n{log}"
    cluster.wait_for("the node's ResourceSlice", lambda: "gpu-0" in slice_devices(cluster), 60,
                     diagnose=lambda: plugin_log(cluster, release))
    cluster.apply([gpu_claim(WORK, "holder"), claim_pod(WORK, "holder", images.plugin, "holder")])
    timings.add(SCENARIO, "claim created -> holder pod Ready", run_ready(cluster, release, WORK, "holder"))
    (result,) = claim_object(cluster, WORK, "holder")["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0" and not result.get("adminAccess"), result


def test_an_admin_access_claim_gets_the_held_gpu(cluster: Cluster, release: Release, images: Images,
                                                 timings: Timings) -> None:
    cluster.apply([gpu_claim(DEBUG, "debug", admin=True), claim_pod(DEBUG, "debug", images.plugin, "debug")])
    timings.add(SCENARIO, "admin claim -> debug pod Ready beside the holder",
                run_ready(cluster, release, DEBUG, "debug"))
    debug = claim_object(cluster, DEBUG, "debug")
    (result,) = debug["status"]["allocation"]["devices"]["results"]
    assert (result["device"], result.get("adminAccess")) == ("gpu-0", True), result
    seen = seen_in_pod(cluster, DEBUG, "debug")
    assert seen["gpus"] == ["nvidia0"], seen["gpus"]
    assert seen["env"].get("NVIDIA_VISIBLE_DEVICES") == "void"
    holder_uid = claim_object(cluster, WORK, "holder")["metadata"]["uid"]
    debug_uid = debug["metadata"]["uid"]
    spec = json.loads(cluster.host(f"cat {CLAIM_SPEC_PREFIX}{debug_uid}.json").stdout)
    # the GPU, and the request's device metadata file its spec mounts (docs/dra.md)
    assert [d["name"] for d in spec["devices"]] == [f"{debug_uid}-gpu-0", f"{debug_uid}-metadata-gpu"]
    # the holder is untouched: still running, its spec in place, the GPU still its own
    assert phase(cluster, WORK, "holder") == "Ready"
    assert spec_exists(cluster, holder_uid)
    assert seen_in_pod(cluster, WORK, "holder")["gpus"] == ["nvidia0"]


def test_a_third_ordinary_claim_stays_pending(cluster: Cluster, release: Release, images: Images) -> None:
    cluster.apply([gpu_claim(WORK, "third"), claim_pod(WORK, "third", images.plugin, "third")])
    time.sleep(8)
    assert phase(cluster, WORK, "third") == "Pending"
    assert not (claim_object(cluster, WORK, "third").get("status") or {}).get("allocation")
    assert "already prepared" not in plugin_log(cluster, release)
    cluster.kubectl("delete", "pod", "-n", WORK, "third", "--wait=true", check=False, timeout=90)


def test_unpreparing_the_admin_claim_leaves_the_holder(cluster: Cluster, release: Release,
                                                      timings: Timings) -> None:
    debug_uid = claim_object(cluster, DEBUG, "debug")["metadata"]["uid"]
    holder_uid = claim_object(cluster, WORK, "holder")["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "-n", DEBUG, "debug", "--wait=true", check=False, timeout=90)
    _, seconds = cluster.wait_for("the admin claim's spec to go", lambda: not spec_exists(cluster, debug_uid),
                                  60, diagnose=lambda: plugin_log(cluster, release))
    timings.add(SCENARIO, "debug pod deleted -> admin claim unprepared", seconds)
    assert spec_exists(cluster, holder_uid)
    assert phase(cluster, WORK, "holder") == "Ready"
    assert seen_in_pod(cluster, WORK, "holder")["gpus"] == ["nvidia0"]
    cluster.kubectl("delete", "pod", "-n", WORK, "holder", "--wait=true", check=False, timeout=90)
    cluster.wait_for("the holder's spec to go", lambda: not spec_exists(cluster, holder_uid), 60,
                     diagnose=lambda: plugin_log(cluster, release))


def test_an_admin_claim_prepared_first_holds_nothing(cluster: Cluster, release: Release, images: Images,
                                                    timings: Timings) -> None:
    cluster.apply([gpu_claim(DEBUG, "debug-first", admin=True),
                   claim_pod(DEBUG, "debug-first", images.plugin, "debug-first")])
    run_ready(cluster, release, DEBUG, "debug-first")
    cluster.apply([gpu_claim(WORK, "after"), claim_pod(WORK, "after", images.plugin, "after")])
    timings.add(SCENARIO, "ordinary claim after an admin claim -> pod Ready",
                run_ready(cluster, release, WORK, "after"))
    assert seen_in_pod(cluster, WORK, "after")["gpus"] == ["nvidia0"]
    assert phase(cluster, DEBUG, "debug-first") == "Ready"
    assert "already prepared" not in plugin_log(cluster, release)
    for namespace, name in ((WORK, "after"), (DEBUG, "debug-first")):
        cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=true", check=False, timeout=90)
