"""DRA driver faults on a real node: a corrupt checkpoint while a hostile claim sits elsewhere in the cluster.

The chart with `dra.enabled=true` on the stand-in showing the mixed profile (four GPUs), the claim specs
pointing at the CDI scenario's fake driver root (tests/e2e/test_dra.py's host set-up).

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
4. a claim force-deleted while its pod runs: the earlier pods deleted, a pod whose claim selects gpu-0
   by its UUID (a CEL selector) runs; the claim's finalizers removed and the claim deleted, so the API
   server no longer has it while its pod keeps running. A second claim selecting gpu-0 is allocated
   gpu-0 by the scheduler (nothing holds it in the scheduler's view), and the plugin refuses to prepare
   it while the first pod runs (the kubelet's pod-resources API shows a container holding the first
   claim): the second pod stays not Ready for HOLD_S, the first claim's spec stays, and the pod's
   events name both claims; the kubelet's retry is refused the same way. The first pod deleted: the
   kubelet's retry prepares the second claim and its pod runs with /dev/nvidia0. (The kubelet retries
   a failed prepare at its periodic sync, about a minute; the story has it sync the pod sooner with an
   annotation change.)
5. uninstall (the module's fixture).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from .e2e_cluster import Cluster, Images, Release, Timings, story_release
from .test_cdi import DRIVER_VERSION, LIBDIR, LIBRARIES, HostSetup
from .test_dra import (
    CLAIM_SPEC_PREFIX,
    MIXED_DRIVER_VERSION,
    claim_host,
    plugin_replaced,
    pod_ready,
    slice_devices,
)

SCENARIO = "DRA faults"
pytestmark = pytest.mark.incremental
DRIVER = "gpu.nvidia.com"
NAMESPACE = "nvdp-e2e-dra-faults-work"  # not the release's: deleting that drops helm's record of it
HOSTILE = "nvdp-e2e-dra-hostile"
CHECKPOINT = f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"
DEPTH = 1500
MAX_DEPTH = 100  # nvdp.kube.claims.MAX_DEPTH, as the message states it
HOLD_S = 20  # how long the second claim's pod is watched not running beside the first
SYNC_EVERY_S = 10  # the kubelet asked to sync a pod not yet Ready this often
FORCE_DELETED: dict[str, str] = {}  # the force-deleted claim's uid, for the steps after
T = TypeVar("T")


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
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images.with_profile("mixed-4"), "nvdp-dra-faults", "nvdp-e2e-dra-faults",
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
    cluster.wait_for("a new plugin pod, Ready", lambda: plugin_replaced(release, before), 120,
                     diagnose=lambda: plugin_log(cluster, release))
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



def gpu_claim(name: str, uuid: str) -> dict[str, Any]:
    selector = f"device.attributes['{DRIVER}'].uuid == '{uuid}'"
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": selector}}]}}]}},
    }  # fmt: skip


def allocated_devices(claim: dict[str, Any]) -> list[str]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [str(r["device"]) for r in (allocation.get("devices") or {}).get("results") or []]


def holders_of(cluster: Cluster, device: str) -> list[str]:
    claims = cluster.kubectl_json("get", "resourceclaims", "-A")["items"]
    return [f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in claims
            if device in allocated_devices(c)]


def delete_pods(cluster: Cluster, *names: str) -> None:
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, *names, "--ignore-not-found", "--wait=true", timeout=90)


def sync_now(cluster: Cluster, name: str) -> None:
    """Have the kubelet sync the pod now: after a failed prepare it tries again only at its next periodic
    sync (a minute later, with jitter), a wait of the kubelet's, not of the plugin's. An annotation
    change is a pod update, which the kubelet syncs at once, preparing its claims again."""
    cluster.kubectl("annotate", "pod", "-n", NAMESPACE, name, "--overwrite",
                    f"nvdp-e2e/sync={time.time_ns()}")


def wait_with_syncs(cluster: Cluster, release: Release, name: str, what: str, probe: Callable[[], T | None],
                    timeout: float) -> tuple[T, float]:
    """`cluster.wait_for`, the kubelet asked to sync pod `name` every SYNC_EVERY_S meanwhile. A prepare
    the kubelet could not finish (refused while the device is held, or its fetch of the claim
    forbidden while the node authorizer has not yet seen the pod bound) is otherwise tried again only
    at its next periodic sync."""
    synced = time.monotonic()

    def nudged() -> T | None:
        nonlocal synced
        found = probe()
        if (found is None or found is False) and time.monotonic() - synced >= SYNC_EVERY_S:
            sync_now(cluster, name)
            synced = time.monotonic()
        return found

    return cluster.wait_for(what, nudged, timeout, diagnose=diagnose(cluster, release))


def ready_with_syncs(cluster: Cluster, release: Release, name: str, timeout: float) -> float:
    return wait_with_syncs(cluster, release, name, f"pod {name} Ready", lambda: pod_ready(pod(cluster, name)),
                           timeout)[1]


def test_a_force_deleted_claim_keeps_its_gpu_while_its_pod_runs(
        cluster: Cluster, release: Release, timings: Timings) -> None:
    # gpu-0 free: the earlier steps' pods (their template claims go with them) and the deep claim
    delete_pods(cluster, "fault-a", "fault-b", "fault-c")
    cluster.kubectl("delete", "resourceclaim", "-n", HOSTILE, "deep", "--ignore-not-found", "--wait=true",
                    timeout=90)
    cluster.wait_for("no claim allocated gpu-0", lambda: not holders_of(cluster, "gpu-0"), 60,
                     diagnose=lambda: str(holders_of(cluster, "gpu-0")))
    uuid = slice_devices(cluster)["gpu-0"]["attributes"]["uuid"]["string"]
    cluster.apply([gpu_claim("first", uuid),
                   claim_pod("first", release.images.plugin, template=None, claim="first")])
    seconds = ready_with_syncs(cluster, release, "first", 90)
    timings.add(SCENARIO, "claim selecting gpu-0 -> pod Ready", seconds)
    claim = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, "first")
    assert allocated_devices(claim) == ["gpu-0"], claim.get("status")
    uid = FORCE_DELETED["uid"] = str(claim["metadata"]["uid"])
    assert spec_exists(cluster, uid)

    start = time.monotonic()
    cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, "first", "--wait=false")
    cluster.kubectl("patch", "resourceclaim", "-n", NAMESPACE, "first", "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}')

    def gone() -> bool:
        found = cluster.kubectl("get", "resourceclaim", "-n", NAMESPACE, "first", check=False)
        return found.returncode != 0 and "NotFound" in found.stderr

    cluster.wait_for("claim first gone from the API server", gone, 30, diagnose=diagnose(cluster, release))
    timings.add(SCENARIO, "claim force-deleted -> gone from the API server", time.monotonic() - start)
    assert pod_ready(pod(cluster, "first")) and restarts(cluster, "first") == 0
    assert spec_exists(cluster, uid), "the claim's spec went while its pod runs"


def refusals(cluster: Cluster, text: str) -> tuple[int, str | None]:
    """How often the second pod's events carry `text` (the kubelet counts repeats), and one message."""
    events = cluster.kubectl_json("get", "events", "-n", NAMESPACE, "--field-selector",
                                  "involvedObject.name=second")["items"]
    found = [e for e in events if text in str(e.get("message", ""))]
    return sum(int(e.get("count") or 1) for e in found), (str(found[0]["message"]) if found else None)


def test_a_second_claim_for_the_gpu_is_refused_while_the_first_pod_runs(
        cluster: Cluster, release: Release, timings: Timings) -> None:
    first_uid = FORCE_DELETED["uid"]
    uuid = slice_devices(cluster)["gpu-0"]["attributes"]["uuid"]["string"]
    cluster.apply([gpu_claim("second", uuid),
                   claim_pod("second", release.images.plugin, template=None, claim="second")])
    start = time.monotonic()
    refusal = f"device gpu-0 is already prepared for claim {NAMESPACE}/first (uid {first_uid})"
    message, seconds = wait_with_syncs(cluster, release, "second", "the second claim's prepare refused",
                                       lambda: refusals(cluster, refusal)[1], 60)
    timings.add(SCENARIO, "second claim for gpu-0 -> prepare refused", seconds)
    print(f"\nthe second claim's pod event: {message}")
    second = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, "second")
    assert allocated_devices(second) == ["gpu-0"], second.get("status")
    assert f"claim {NAMESPACE}/second (uid {second['metadata']['uid']})" in message, message
    # The kubelet's retry while the first pod runs is refused the same way, and nothing starts the
    # second pod beside the first for HOLD_S.
    sync_now(cluster, "second")
    retried = False
    while time.monotonic() < start + HOLD_S or not retried:
        assert not pod_ready(pod(cluster, "second")), "the second claim's pod runs beside the first"
        assert pod(cluster, "second")["status"].get("phase") == "Pending"
        assert pod_ready(pod(cluster, "first")), "the first pod stopped running"
        retried = retried or refusals(cluster, refusal)[0] >= 2
        assert retried or time.monotonic() < start + 2 * HOLD_S, "the kubelet did not prepare again"
        time.sleep(1)
    print(f"the second pod not running beside the first for {time.monotonic() - start:.1f} s, "
          f"refused {refusals(cluster, refusal)[0]}x")
    assert spec_exists(cluster, first_uid), "the force-deleted claim's spec went while its pod runs"
    assert not spec_exists(cluster, str(second["metadata"]["uid"])), "the second claim was prepared"
    log = plugin_log(cluster, release)
    assert f"Keeping claim {NAMESPACE}/first (uid {first_uid}) as prepared" in log \
        and "a container on this node still holds it" in log, log


def test_the_second_pod_runs_once_the_first_pod_is_gone(
        cluster: Cluster, release: Release, timings: Timings) -> None:
    start = time.monotonic()
    delete_pods(cluster, "first")
    sync_now(cluster, "second")
    ready_with_syncs(cluster, release, "second", 60)
    timings.add(SCENARIO, "first pod deleted -> second pod Ready", time.monotonic() - start)
    uid = str(cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, "second")["metadata"]["uid"])
    assert spec_exists(cluster, uid)
    assert not spec_exists(cluster, FORCE_DELETED["uid"]), "the force-deleted claim's spec is left"
    gpus = cluster.exec(NAMESPACE, "second", "sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$'").split()
    assert gpus == ["nvidia0"], gpus
    delete_pods(cluster, "second")
    cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, "second", "--wait=true", timeout=90)
    cluster.wait_for("the second claim's spec to go", lambda: not spec_exists(cluster, uid), 60,
                     diagnose=lambda: plugin_log(cluster, release))
