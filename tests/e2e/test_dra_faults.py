"""DRA driver faults on a real node: a corrupt checkpoint while a hostile claim sits elsewhere in the cluster.

The chart with `dra.enabled=true` on the mixed profile's stand-in (four GPUs), the claim specs pointing
at the CDI scenario's fake driver root (tests/e2e/test_dra.py's host set-up).

The story, each step on the one before:
1. install; two pods with a claim for one GPU each are Running, each claim's CDI spec on the host.
2. in another namespace a ResourceClaim whose opaque parameters nest 1500 levels deep (about 3 KB; the
   API server stores it, a JSON decoder gives up on it); the plugin's checkpoint overwritten with
   garbage; the plugin pod deleted. The new plugin sets the checkpoint aside (a `.bad-*` copy and a
   CheckpointSetAside Event), lists the claims, names the deep claim's field and skips it, and rebuilds
   both running claims: both specs stay on the host, both pods stay Running without a restart, and a
   new claim pod runs on a third GPU.
3. a pod using the deep claim: the scheduler allocates it a GPU, and the plugin refuses to prepare it,
   its pod's events naming the claim, the field and the limit.
4. uninstall (the module's fixture).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import Cluster, Release, Timings, story_release
from .test_cdi import DRIVER_VERSION, LIBDIR, LIBRARIES, HostSetup
from .test_dra import CLAIM_SPEC_PREFIX, MIXED_DRIVER_VERSION, claim_host, pod_ready

SCENARIO = "DRA faults"
pytestmark = pytest.mark.incremental
DRIVER = "gpu.nvidia.com"
NAMESPACE = "nvdp-e2e-dra-faults-work"  # not the release's: deleting that drops helm's record of it
HOSTILE = "nvdp-e2e-dra-hostile"
CHECKPOINT = f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"
DEPTH = 1500
MAX_DEPTH = 100  # nvdp.kube.claims.MAX_DEPTH, as the message states it


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        for minor in (1, 2, 3):  # the mixed profile's other GPUs: their device nodes for the specs
            path = f"/dev/nvidia{minor}"
            make = f"[ -e {path} ] || {{ mknod -m 666 {path} c 195 {minor} && echo made; }}"
            made = cluster.host(make).stdout
            if made.strip() == "made":
                setup.made_nodes.append(path)
            cluster.host(f"mknod -m 666 {setup.driver_root}/dev/nvidia{minor} c 195 {minor}")
        lib = f"{setup.driver_root}{LIBDIR}"
        for name in LIBRARIES:
            cluster.host(f"cp {lib}/{name}.so.{DRIVER_VERSION} {lib}/{name}.so.{MIXED_DRIVER_VERSION}")
        yield setup


@pytest.fixture(scope="module")
def release(cluster: Cluster, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, cluster.build_images("mixed-4"), "nvdp-dra-faults", "nvdp-e2e-dra-faults",
                       work=[NAMESPACE, HOSTILE]) as release:
        yield release


def values(host: HostSetup) -> list[str]:
    return [
        "--set", "dra.enabled=true",
        "--set", f"nvidiaDriverRoot={host.driver_root}",
        "--set", "nvidiaDevRoot=/",
        "--set", f"cdi.nvidiaHookPath={host.hook}",
    ]  # fmt: skip


def plugin_log(cluster: Cluster, release: Release) -> str:
    return cluster.logs(release.namespace, f"{release.selector},app.kubernetes.io/component=dra-plugin", 400)


def claim_pod(name: str, image: str, namespace: str = NAMESPACE, template: str | None = "one-gpu",
              claim: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template} if claim is None else {"resourceClaimName": claim}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", **source}],
            "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"], "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def deep_claim_json(name: str) -> str:
    """A claim whose opaque parameters nest DEPTH levels: built as text, as json.dumps would recurse."""
    parameters = '{"a":' * (DEPTH - 1) + '{"leaf":1}' + "}" * (DEPTH - 1)
    return ('{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",'
            f'"metadata":{{"name":"{name}","namespace":"{HOSTILE}"}},'
            '"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.nvidia.com"}}],'
            f'"config":[{{"opaque":{{"driver":"other.example.com","parameters":{parameters}}}}}]}}}}}}')


def pod(cluster: Cluster, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    found: dict[str, Any] = cluster.kubectl_json("get", "pod", "-n", namespace, name)
    return found


def restarts(cluster: Cluster, name: str) -> int:
    statuses = pod(cluster, name)["status"].get("containerStatuses") or []
    return sum(int(c.get("restartCount", 0)) for c in statuses)


def claim_uid(cluster: Cluster, name: str) -> str:
    (status,) = pod(cluster, name)["status"]["resourceClaimStatuses"]
    claim = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, status["resourceClaimName"])
    return str(claim["metadata"]["uid"])


def spec_exists(cluster: Cluster, uid: str) -> bool:
    return cluster.host(f"test -e {CLAIM_SPEC_PREFIX}{uid}.json", check=False).returncode == 0


def diagnose(cluster: Cluster, release: Release, namespace: str = NAMESPACE) -> Any:
    def text() -> str:
        pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
        return f"{pods}\n{events}\n{plugin_log(cluster, release)}"
    return text


def run_ready(cluster: Cluster, release: Release, name: str) -> float:
    cluster.apply(claim_pod(name, release.images.plugin))
    _, seconds = cluster.wait_for(f"pod {name} Ready", lambda: pod_ready(pod(cluster, name)), 120,
                                  diagnose=diagnose(cluster, release))
    return seconds


# --- the story ----------------------------------------------------------------------------------------


def test_two_claim_pods_run(cluster: Cluster, release: Release, host: HostSetup, timings: Timings) -> None:
    done = release.install(*values(host), check=False)
    assert done.returncode == 0, (
        f"helm install failed:\n{done.stderr[-2000:]}\n{plugin_log(cluster, release)}")
    cluster.wait_for("the kubelet's registration", lambda: "Registered with the kubelet" in plugin_log(
        cluster, release), 90, diagnose=lambda: plugin_log(cluster, release))
    cluster.apply({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}},
    })  # fmt: skip
    for name in ("fault-a", "fault-b"):
        timings.add(SCENARIO, f"claim pod {name} Ready", run_ready(cluster, release, name))
    for name in ("fault-a", "fault-b"):
        assert spec_exists(cluster, claim_uid(cluster, name))


def test_a_garbage_checkpoint_beside_a_deep_claim_keeps_both_specs(
        cluster: Cluster, release: Release, timings: Timings) -> None:
    uids = [claim_uid(cluster, name) for name in ("fault-a", "fault-b")]
    cluster.kubectl("create", "-f", "-", stdin=deep_claim_json("deep"))
    assert cluster.host(f"test -e {CHECKPOINT}", check=False).returncode == 0, "no checkpoint where expected"
    cluster.host(f"ls {CHECKPOINT}.bad-* 2>/dev/null | xargs -r rm -f; "
                 f"head -c 512 /dev/urandom > {CHECKPOINT}")
    before = {p["metadata"]["name"] for p in release.pods("dra-plugin")}
    start = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", release.namespace, *before, "--grace-period=0", "--force",
                    "--wait=false")

    def replaced() -> bool:
        pods = release.pods("dra-plugin")
        names = {p["metadata"]["name"] for p in pods}
        return bool(names) and not names & before and all(pod_ready(p) for p in pods)

    cluster.wait_for("a new plugin pod, Ready", replaced, 120, diagnose=lambda: plugin_log(cluster, release))
    cluster.wait_for("the plugin's start to finish", lambda: "Prepared claims on this node:" in plugin_log(
        cluster, release), 60, diagnose=lambda: plugin_log(cluster, release))
    timings.add(SCENARIO, "plugin pod deleted -> new one Ready, claims rebuilt", time.monotonic() - start)
    log = plugin_log(cluster, release)
    kept = [uid for uid in uids if spec_exists(cluster, uid)]
    print(f"\nspecs kept after the restart: {len(kept)}/2")
    assert len(kept) == 2, f"the running pods' specs were removed:\n{log}"
    assert "Prepared claims on this node: 2" in log, log
    assert f"{HOSTILE}/deep" in log and "spec.devices.config[0].opaque.parameters is nested more than " \
        f"{MAX_DEPTH} levels deep" in log, log
    assert cluster.host(f"ls {CHECKPOINT}.bad-*", check=False).stdout.strip(), "the bad checkpoint is kept"
    events = cluster.kubectl_json("get", "events", "-A", "--field-selector",
                                  f"involvedObject.name={cluster.node},reason=CheckpointSetAside")["items"]
    assert events, "no CheckpointSetAside Event on the Node"
    for name in ("fault-a", "fault-b"):
        assert pod_ready(pod(cluster, name)) and restarts(cluster, name) == 0
    timings.add(SCENARIO, "new claim pod Ready after the rebuild", run_ready(cluster, release, "fault-c"))


def test_the_deep_claim_itself_is_refused_naming_the_field(
        cluster: Cluster, release: Release, timings: Timings) -> None:
    cluster.apply(claim_pod("deep-user", release.images.plugin, namespace=HOSTILE, claim="deep"))

    def refused() -> str | None:
        events = cluster.kubectl_json("get", "events", "-n", HOSTILE, "--field-selector",
                                      "involvedObject.name=deep-user")["items"]
        found = [str(e.get("message", "")) for e in events if "nested more than" in str(e.get("message", ""))]
        return found[0] if found else None

    message, seconds = cluster.wait_for("the deep claim's prepare refused", refused, 120,
                                        diagnose=diagnose(cluster, release, HOSTILE))
    timings.add(SCENARIO, "deep claim pod -> prepare refused", seconds)
    print(f"\nthe deep claim's pod event: {message}")
    assert f"ResourceClaim {HOSTILE}/deep" in message, message
    assert f"spec.devices.config[0].opaque.parameters is nested more than {MAX_DEPTH} levels deep" in message
    assert pod(cluster, "deep-user", HOSTILE)["status"].get("phase") == "Pending"
    cluster.kubectl("delete", "pod", "-n", HOSTILE, "deep-user", "--wait=true", check=False, timeout=90)

