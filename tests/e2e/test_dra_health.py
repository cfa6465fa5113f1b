"""DRA mode on a real node: a GPU that goes down is tainted in the slice and Unhealthy in the pod's status.

The chart installed with `dra.enabled=true`, the T4 shared by time-slicing x10 (one device, `gpu-0`, that
ten claims can be allocated: a second claim is kept off it only by a taint), a quiet period of 20 s
(`devicePlugin.healthRecovery.after`, which the DRA plugin takes as the device plugin does), on the CDI
scenario's fake driver root. A watch on the node's ResourceSlice (kubectl, on a background thread) sees
every write of it with the time it arrived. The story, each step on the one before:
1. install: the DRA plugin has HEALTH_RECOVERY_AFTER=20s; a claim pod Running shows gpu-0 Healthy in its
   `allocatedResourcesStatus`.
2. XID 48: gpu-0 carries `gpu.nvidia.com/xid=48:NoSchedule` and `gpu.nvidia.com/recovery=needs-reset`,
   written in one slice write; the pod shows gpu-0 Unhealthy with the XID and what brings it back; a
   second claim pod is not scheduled (PodScheduled=False, Unschedulable) although nine replicas are free;
   `nvdp health clear` in the DRA plugin's pod removes the taints, the second pod runs, both pods Healthy.
3. XID 94: the taints with `recovery=recovering`, removed by the plugin itself after the quiet period;
   the pods Unhealthy, then Healthy again.
4. `dra.healthTaintEffect=NoExecute` (helm upgrade): beside the two, a pod whose claim tolerates
   `gpu.nvidia.com/xid` and `gpu.nvidia.com/recovery` as docs/dra.md shows (any effect, and NoExecute
   named) and one whose claim tolerates them with no effect named; XID 94 -> the taints are NoExecute,
   the kube-controller-manager's device taint eviction controller deletes the three pods without a
   NoExecute toleration (Kubernetes 1.36 honours only tolerations naming the effect), the tolerating pod
   keeps running (no restart), Unhealthy, then Healthy when the GPU comes back.

Timings (XID -> taint in the API, -> pod Unhealthy, recovery/clear -> taints gone, slice writes per
fault) are recorded, never asserted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .e2e_cluster import DATA, Cluster, Images, Release, Timings, story_release
from .test_cdi import T4_UUID, HostSetup
from .test_dra import DRIVER, claim_host, slice_devices, values

SCENARIO = "DRA health"
pytestmark = pytest.mark.incremental
NAMESPACE = "nvdp-e2e-dra-health-work"
LABELS = {"nvdp-e2e-story": "dra-health"}
DEVICE = "gpu-0"
XID_KEY, RECOVERY_KEY = "gpu.nvidia.com/xid", "gpu.nvidia.com/recovery"
# The second claim pod of step 2 waits for the kubelet's second try at most (see test_dra_sharing.py).
POD_READY_S = 120
TAINT_S = 15  # bound for XID -> taint; seen in well under a second
STATUS_S = 60  # bound for the kubelet to show a device's health in the pod's status
EXTRA = ("--set", "devicePlugin.healthRecovery.after=20s",
         "--set", "devicePlugin.healthRecovery.flapLimit=10",
         "--set-file", f"config.map.config={DATA / 'dra-time-slicing-10.yaml'}")


# --- the slice, watched ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SliceChange:
    at: float  # time.monotonic() when the watch event arrived
    kind: str  # ADDED, MODIFIED, DELETED
    version: str  # the slice's resourceVersion
    taints: tuple[tuple[str, str, str], ...]  # gpu-0's (key, value, effect)


class SliceWatch:
    """`kubectl get resourceslices --watch` for this node's slices of the driver: every change, timed."""

    def __init__(self, cluster: Cluster) -> None:
        self._argv = [*cluster.kubectl_argv(), "get", "resourceslices", "--watch", "--output-watch-events",
                      "-o", "json", "--field-selector", f"spec.nodeName={cluster.node},spec.driver={DRIVER}"]
        self._lock = threading.Lock()
        self.changes: list[SliceChange] = []
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._loop, name="slice-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        decoder = json.JSONDecoder()
        while not self._stop.is_set():  # a watch the server ends is opened again
            self._proc = subprocess.Popen(self._argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert self._proc.stdout is not None
            fd, buffer = self._proc.stdout.fileno(), ""
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                at = time.monotonic()
                buffer += chunk.decode()
                while buffer.strip():
                    try:
                        event, end = decoder.raw_decode(buffer.lstrip())
                    except json.JSONDecodeError:
                        break  # the rest of this event comes with the next chunk
                    buffer = buffer.lstrip()[end:]
                    self._record(at, event)
            self._proc.wait()
            if not self._stop.is_set():
                time.sleep(0.5)

    def _record(self, at: float, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        devices = {d["name"]: d for d in (obj.get("spec") or {}).get("devices") or []}
        taints = tuple((t["key"], t.get("value", ""), t["effect"])
                       for t in (devices.get(DEVICE) or {}).get("taints") or [])
        with self._lock:
            self.changes.append(SliceChange(at, str(event.get("type")),
                                            str(obj.get("metadata", {}).get("resourceVersion")), taints))

    def since(self, start: float) -> list[SliceChange]:
        with self._lock:
            return [c for c in self.changes if c.at >= start]

    def latest(self) -> SliceChange | None:
        with self._lock:
            return self.changes[-1] if self.changes else None

    def wait(self, what: str, start: float, wanted: Any, timeout: float) -> SliceChange:
        """The first change after `start` whose taints `wanted` accepts."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((c for c in self.since(start) if wanted(c.taints)), None)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; slice changes since: "
                                     f"{self.since(start)}")
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
        self._thread.join(timeout=5)


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        yield setup


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images, "nvdp-dra-health", "nvdp-e2e-dra-health", work=[NAMESPACE],
                       remove_timeout=180) as release:
        yield release


@pytest.fixture(scope="module")
def watch(cluster: Cluster, release: Release) -> Iterator[SliceWatch]:
    watcher = SliceWatch(cluster)
    yield watcher
    watcher.close()


# --- objects ---------------------------------------------------------------------------------------------


def tolerations(effect: str | None) -> list[dict[str, str]]:
    """Tolerations of the health taints: of any effect (None), or naming `effect`."""
    named = {"effect": effect} if effect else {}
    return [{"key": key, "operator": "Exists", **named} for key in (XID_KEY, RECOVERY_KEY)]


def template(name: str, tolerate: list[dict[str, str]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if tolerate:
        exactly["tolerations"] = tolerate
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def pod(name: str, image: str, claim_template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
            "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"], "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


# --- reading the cluster ---------------------------------------------------------------------------------


def plugin_pod(release: Release) -> dict[str, Any]:
    (found,) = [p for p in release.pods("dra-plugin") if not p["metadata"].get("deletionTimestamp")]
    return found


def plugin_env(release: Release) -> dict[str, Any]:
    containers = plugin_pod(release)["spec"]["containers"]
    return {e["name"]: e.get("value") for c in containers for e in c.get("env", [])}


def plugin_log(cluster: Cluster, release: Release) -> str:
    """The running DRA plugin's whole log (append-only: a later read extends an earlier one)."""
    found = plugin_pod(release)
    name, container = found["metadata"]["name"], found["spec"]["containers"][0]["name"]
    return cluster.kubectl("logs", "-n", release.namespace, name, "-c", container, check=False).stdout


def fault_writes(log: str) -> int:
    """The API writes of the publishes that left a device unhealthy (the plugin's INFO lines)."""
    found = re.findall(r"ResourceSlices published \((\d+) API writes?\): \d+ device\(s\), (\d+) unhealthy",
                       log)
    return sum(int(writes) for writes, unhealthy in found if int(unhealthy))


def get_pod(cluster: Cluster, name: str) -> dict[str, Any] | None:
    done = cluster.kubectl("get", "pod", "-n", NAMESPACE, name, "-o", "json", check=False)
    found: dict[str, Any] | None = json.loads(done.stdout) if done.returncode == 0 else None
    return found


def must_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    found = get_pod(cluster, name)
    assert found is not None, f"pod {name} is gone"
    return found


def ready(found: dict[str, Any] | None) -> bool:
    return found is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in found["status"].get("conditions") or [])


def device_status(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """gpu-0's entry in the pod's `allocatedResourcesStatus` (its health and message). The kubelet names
    a device by its CDI device ID where the prepare gave one (`k8s.gpu.nvidia.com/claim=<uid>-gpu-0`),
    else `<driver>/<pool>/<device>`."""
    for status in (found or {}).get("status", {}).get("containerStatuses") or []:
        for claim in status.get("allocatedResourcesStatus") or []:
            for resource in claim.get("resources") or []:
                if re.search(f"[-/]{DEVICE}$", resource.get("resourceID", "")):
                    return dict(resource)
    return None


def diagnose(cluster: Cluster, release: Release, *names: str) -> Any:
    def text() -> str:
        described = "\n".join(cluster.kubectl("get", "pod", "-n", NAMESPACE, n, "-o", "yaml",
                                               check=False).stdout for n in names)
        events = cluster.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout
        return f"{described}\n{events}\n{plugin_log(cluster, release)[-6000:]}"
    return text


def run_ready(cluster: Cluster, release: Release, images: Images, name: str, claim_template: str) -> float:
    cluster.apply(pod(name, images.plugin, claim_template))
    _, seconds = cluster.wait_for(f"pod {name} Ready", lambda: ready(get_pod(cluster, name)), POD_READY_S,
                                  diagnose=diagnose(cluster, release, name))
    return seconds


def wait_health(cluster: Cluster, release: Release, name: str, health: str, text: str = "") -> tuple[
        dict[str, Any], float]:
    def probe() -> dict[str, Any] | None:
        found = device_status(get_pod(cluster, name))
        return found if found and found.get("health") == health and text in found.get("message", "") else None
    return cluster.wait_for(f"pod {name}: {DEVICE} {health}", probe, STATUS_S,
                            diagnose=diagnose(cluster, release, name))


def xid_taints(xid: int, state: str, effect: str) -> Any:
    wanted = {(XID_KEY, str(xid), effect), (RECOVERY_KEY, state, effect)}
    return lambda taints: set(taints) == wanted


def untainted(taints: tuple[tuple[str, str, str], ...]) -> bool:
    return not taints


def fault(cluster: Cluster, release: Release, watch: SliceWatch, timings: Timings, xid: int, state: str,
          effect: str, pods: list[str]) -> float:
    """Inject `xid`: the taints in one slice write, each pod's status Unhealthy; the XID's time."""
    log_before = plugin_log(cluster, release)
    start = time.monotonic()
    cluster.inject_xid(T4_UUID, xid)
    change = watch.wait(f"{DEVICE} tainted xid={xid}, recovery={state}", start,
                        xid_taints(xid, state, effect), TAINT_S)
    # In milliseconds (the table's one decimal would show 0.0 s).
    timings.add(SCENARIO, f"XID {xid} -> {effect} taints in the API (watch; value in ms)",
                (change.at - start) * 1000)
    print(f"XID {xid} -> taints {change.taints} in the API after {(change.at - start) * 1000:.0f} ms")
    for name in pods:
        shown, _ = wait_health(cluster, release, name, "Unhealthy", f"XID {xid}")
        timings.add(SCENARIO, f"XID {xid} -> pod {name} shows {DEVICE} Unhealthy", time.monotonic() - start)
        print(f"pod {name}: {shown}")
    # Every slice write between the XID and now that left the device tainted (the pod statuses took
    # seconds; an XID 94 may already be over, its removal is not the fault's): one.
    writes = [c for c in watch.since(start) if c.kind == "MODIFIED" and c.taints]
    logged = fault_writes(plugin_log(cluster, release)[len(log_before):])
    timings.add(SCENARIO, f"XID {xid}: slice writes while tainted (watch; value a count)", len(writes))
    print(f"XID {xid}: {len(writes)} slice change(s) seen, {logged} API write(s) logged by the plugin")
    assert len(writes) == 1 and logged == 1, (writes, logged)
    return start


# --- the story -------------------------------------------------------------------------------------------


def test_install_and_a_claim_pod_sees_its_gpu_healthy(cluster: Cluster, release: Release, images: Images,
                                                      host: HostSetup, watch: SliceWatch,
                                                      timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install (dra.enabled, time-slicing x10, recovery 20s) --wait"):
        done = release.install(*values(host), *EXTRA, check=False)
    assert done.returncode == 0, f"helm install failed:\n{done.stderr[-2000:]}"
    env = plugin_env(release)
    assert env.get("HEALTH_RECOVERY_AFTER") == "20s" and "HEALTH_TAINT_EFFECT" not in env, env
    cluster.wait_for("the shared T4 in the slice", lambda: slice_devices(cluster).get(DEVICE), 60,
                     diagnose=lambda: plugin_log(cluster, release))
    cluster.wait_for("the kubelet's registration",
                     lambda: "Registered with the kubelet" in plugin_log(cluster, release), 60)
    cluster.apply(template("plain"))
    timings.add(SCENARIO, "claim pod first -> Ready", run_ready(cluster, release, images, "first", "plain"))
    shown, seconds = wait_health(cluster, release, "first", "Healthy")
    timings.add(SCENARIO, "pod first Ready -> Healthy in allocatedResourcesStatus", seconds)
    assert shown["message"] == "healthy", shown
    latest = watch.latest()
    assert latest is not None and latest.taints == (), latest


def test_an_xid_48_taints_the_device_until_cleared(cluster: Cluster, release: Release, images: Images,
                                                   watch: SliceWatch, timings: Timings) -> None:
    fault(cluster, release, watch, timings, 48, "needs-reset", "NoSchedule", ["first"])
    shown = device_status(get_pod(cluster, "first"))
    assert shown is not None and "needs a GPU reset" in shown["message"], shown
    assert ready(get_pod(cluster, "first"))  # NoSchedule: the running pod is left alone
    # Nine replicas are free: only the taint keeps a second claim off the GPU.
    cluster.apply(pod("second", images.plugin, "plain"))

    def unschedulable() -> dict[str, Any] | None:
        found = get_pod(cluster, "second")
        conditions = (found or {}).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"
                     and c.get("reason") == "Unschedulable"), None)

    condition, seconds = cluster.wait_for("pod second: PodScheduled=False", unschedulable, 60,
                                          diagnose=diagnose(cluster, release, "second"))
    timings.add(SCENARIO, "second claim pod -> PodScheduled=False (Unschedulable)", seconds)
    print(f"pod second: {condition}")
    found = get_pod(cluster, "second")
    assert found is not None and not found["spec"].get("nodeName"), found
    shown_health = cluster.exec(release.namespace, plugin_pod(release)["metadata"]["name"], "nvdp", "health")
    assert f"{T4_UUID}  needs-reset" in shown_health, shown_health
    start = time.monotonic()
    out = cluster.exec(release.namespace, plugin_pod(release)["metadata"]["name"], "nvdp", "health", "clear",
                       T4_UUID)
    assert T4_UUID in out, out
    change = watch.wait(f"{DEVICE} without taints", start, untainted, 30)
    timings.add(SCENARIO, "nvdp health clear -> taints removed in the API", change.at - start)
    _, seconds = cluster.wait_for("pod second Ready", lambda: ready(get_pod(cluster, "second")), POD_READY_S,
                                  diagnose=diagnose(cluster, release, "second"))
    timings.add(SCENARIO, "nvdp health clear -> second claim pod Ready", time.monotonic() - start)
    for name in ("first", "second"):
        wait_health(cluster, release, name, "Healthy")
    timings.add(SCENARIO, "nvdp health clear -> both pods Healthy", time.monotonic() - start)


def test_an_xid_94_taints_it_until_the_quiet_period_ends(cluster: Cluster, release: Release,
                                                         watch: SliceWatch, timings: Timings) -> None:
    start = fault(cluster, release, watch, timings, 94, "recovering", "NoSchedule", ["first", "second"])
    shown = device_status(get_pod(cluster, "first"))
    assert shown is not None and "comes back by itself" in shown["message"], shown
    change = watch.wait(f"{DEVICE} without taints", start, untainted, 90)
    timings.add(SCENARIO, "XID 94 -> taints removed by the plugin (quiet period 20 s)", change.at - start)
    for name in ("first", "second"):
        wait_health(cluster, release, name, "Healthy")
        timings.add(SCENARIO, f"XID 94 -> pod {name} Healthy again", time.monotonic() - start)
    assert all(ready(get_pod(cluster, name)) for name in ("first", "second"))


def test_no_execute_evicts_the_pods_whose_claims_do_not_tolerate_it(
        cluster: Cluster, release: Release, images: Images, host: HostSetup, watch: SliceWatch,
        timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm upgrade dra.healthTaintEffect=NoExecute --wait"):
        release.upgrade(*values(host), *EXTRA, "--set", "dra.healthTaintEffect=NoExecute")
    cluster.wait_for("the new DRA plugin pod", lambda: len(release.pods("dra-plugin")) == 1 or None, 90)
    env = plugin_env(release)
    assert env.get("HEALTH_TAINT_EFFECT") == "NoExecute", env
    release.wait_ready("dra-plugin", 90)
    cluster.wait_for("the kubelet's registration",
                     lambda: "Registered with the kubelet" in plugin_log(cluster, release), 60)
    # The claim docs/dra.md shows for a diagnostics pod: the health taints tolerated with any effect (the
    # scheduler, NoSchedule) and with NoExecute named (the eviction controller honours no other).
    cluster.apply([template("tolerant", tolerations(None) + tolerations("NoExecute")),
                   template("any-effect", tolerations(None))])
    timings.add(SCENARIO, "tolerating claim pod -> Ready",
                run_ready(cluster, release, images, "tolerant", "tolerant"))
    run_ready(cluster, release, images, "any-effect", "any-effect")
    (claim_status,) = must_pod(cluster, "tolerant")["status"]["resourceClaimStatuses"]
    claim = cluster.kubectl_json("get", "resourceclaim", "-n", NAMESPACE, claim_status["resourceClaimName"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] == DEVICE and len(result.get("tolerations") or []) == 4, result
    doomed = ("first", "second", "any-effect")
    uids = {name: must_pod(cluster, name)["metadata"]["uid"] for name in doomed}
    start = fault(cluster, release, watch, timings, 94, "recovering", "NoExecute", ["tolerant"])

    def evicted() -> bool:
        return all((found := get_pod(cluster, name)) is None or found["metadata"]["uid"] != uid
                   or found["metadata"].get("deletionTimestamp") is not None for name, uid in uids.items())

    cluster.wait_for(f"pods {', '.join(doomed)} evicted", evicted, 60,
                     diagnose=diagnose(cluster, release, *doomed))
    timings.add(SCENARIO, "XID 94 (NoExecute) -> the 3 pods without a NoExecute toleration deleted",
                time.monotonic() - start)
    events = cluster.kubectl_json("get", "events", "-n", NAMESPACE, "--field-selector",
                                  "reason=DeviceTaintManagerEviction")["items"]
    print("evictions: " + "; ".join(f"{e['involvedObject']['name']}: {e['source']} {e['message']}"
                                    for e in events))
    # Kubernetes 1.36's device taint eviction controller: a toleration without an effect does not keep
    # a pod (docs/dra.md); the one naming NoExecute does.
    assert {e["involvedObject"]["name"] for e in events} == set(doomed), events
    tolerant = must_pod(cluster, "tolerant")
    assert ready(tolerant), tolerant
    assert tolerant["status"]["containerStatuses"][0]["restartCount"] == 0
    change = watch.wait(f"{DEVICE} without taints", start, untainted, 90)
    timings.add(SCENARIO, "XID 94 (NoExecute) -> taints removed (quiet period 20 s)", change.at - start)
    wait_health(cluster, release, "tolerant", "Healthy")
    assert ready(must_pod(cluster, "tolerant"))
