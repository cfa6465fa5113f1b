"""Per-node mode on a real node: the config label moves the node between the device plugin and DRA.

Installed with `dra.enabled=true`, `dra.defaultMode=device-plugin` and two per-node entries, `dp`
(flags.mode device-plugin, also config.default) and `dra` (flags.mode dra), so both DaemonSets run on
the node and the label `nvidia.com/device-plugin.config` picks the mode. The driver files the DRA
plugin's claim specs point at are the fake driver root of the CDI scenario (tests/e2e/test_cdi.py).

A background poller reads, every 0.2 s through the API, the Node's allocatable and capacity of
nvidia.com/gpu and the devices in the node's ResourceSlices of driver gpu.nvidia.com. At no sample are
both advertised (allocatable > 0 and a slice with a device); neither shows only between a label change
and the moment the new mode advertises. The kubelet publishes allocatable with its node status (every
10 s), so a switch to DRA takes up to one status period: the DRA plugin publishes once allocatable
shows the device plugin gone. The switch times are recorded in the timings.

1. install: allocatable 1, no slice (the DRA plugin publishes nothing in device-plugin mode);
2. label dra: the device plugin withdraws, then the slice; a ModeSwitched Event "device-plugin -> dra";
   what allocatable and capacity show right after (the kubelet's 5-minute grace keeps the capacity);
3. label dp: the slice goes, then allocatable 1 again; ModeSwitched "dra -> device-plugin";
4. a pod with nvidia.com/gpu Running: label dra is refused, a ModeSwitchRefused Event names the pod,
   allocatable stays 1 and no slice; the pod deleted, the node switches by itself;
5. in DRA mode, a pod with a claim Running: label dp is refused (the Event names the pod and its
   claim); the pod deleted, the node switches back by itself;
6. uninstall: no plugin pods (the kubelet then deletes the slices, as tests/e2e/test_dra.py shows).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .e2e_cluster import DATA, GPU, Cluster, Images, Release, Timings, story_release
from .test_cdi import HostSetup
from .test_dra import claim_host

SCENARIO = "per-node mode"
pytestmark = pytest.mark.incremental
LABEL = "nvidia.com/device-plugin.config"
DRIVER = "gpu.nvidia.com"
WORK = "nvdp-e2e-mode-work"
# A switch to DRA waits for the kubelet's next node status (10 s); a refused one is tried every 10 s.
SWITCH_S = 60.0
TAIL_S = 11.0


@dataclass(frozen=True)
class Sample:
    at: float
    allocatable: int | None
    capacity: int | None
    devices: int  # in the node's ResourceSlices of the driver


class ModePoller:
    """The Node's nvidia.com/gpu and the node's slices through `kubectl proxy`, every `every` s."""

    def __init__(self, cluster: Cluster, every: float = 0.2) -> None:
        self.cluster, self.every = cluster, every
        self.samples: list[Sample] = []
        self.errors = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proxy: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._node_url = self._slices_url = ""

    def __enter__(self) -> ModePoller:
        self._proxy = subprocess.Popen([*self.cluster.kubectl_argv(), "proxy", "--port=0"], text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self._proxy.stdout is not None
        line = self._proxy.stdout.readline()
        if not line.startswith("Starting to serve on "):
            self._proxy.kill()
            raise AssertionError(f"kubectl proxy did not start: {line!r}")
        base = f"http://{line.split()[-1]}"
        self._node_url = f"{base}/api/v1/nodes/{self.cluster.node}"
        selector = urllib.parse.quote(f"spec.nodeName={self.cluster.node},spec.driver={DRIVER}")
        self._slices_url = f"{base}/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}"
        self._thread = threading.Thread(target=self._loop, name="mode poller", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._proxy is not None:
            self._proxy.terminate()
            self._proxy.wait(10)

    def _get(self, url: str) -> Any:
        with self._opener.open(url, timeout=5) as answer:
            return json.load(answer)

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                status = self._get(self._node_url)["status"]
                slices = self._get(self._slices_url)["items"]
                devices = sum(len(s["spec"].get("devices") or []) for s in slices)
                sample = Sample(time.monotonic(), _count(status.get("allocatable")),
                                _count(status.get("capacity")), devices)
                with self._lock:
                    self.samples.append(sample)
            except (OSError, ValueError, KeyError) as err:
                self.errors += 1
                self.last_error = repr(err)
            due = max(due + self.every, time.monotonic())
            self._stop.wait(due - time.monotonic())

    def since(self, start: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.at >= start]

    def latest(self) -> Sample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None


def _count(resources: dict[str, str] | None) -> int | None:
    value = (resources or {}).get(GPU)
    return None if value is None else int(value)


def dp_mode(sample: Sample | None) -> bool:
    return sample is not None and (sample.allocatable or 0) > 0 and sample.devices == 0


def dra_mode(sample: Sample | None) -> bool:
    return sample is not None and not (sample.allocatable or 0) and sample.devices > 0


def both(sample: Sample) -> bool:
    return (sample.allocatable or 0) > 0 and sample.devices > 0


def neither(sample: Sample) -> bool:
    return not (sample.allocatable or 0) and sample.devices == 0


def describe(samples: list[Sample], start: float) -> str:
    runs: list[tuple[str, int, float, float]] = []
    for s in samples:
        key = f"alloc {s.allocatable} cap {s.capacity} devices {s.devices}"
        at = s.at - start
        if runs and runs[-1][0] == key:
            runs[-1] = (key, runs[-1][1] + 1, runs[-1][2], at)
        else:
            runs.append((key, 1, at, at))
    return "; ".join(f"{key} x{n} ({a:.1f}-{b:.1f} s)" for key, n, a, b in runs)


@pytest.fixture(scope="module")
def host(cluster: Cluster) -> Iterator[HostSetup]:
    with claim_host(cluster) as setup:
        yield setup


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images, host: HostSetup) -> Iterator[Release]:
    with story_release(cluster, images, "nvdp-mode", "nvdp-e2e-mode", work=[WORK],
                       labels={LABEL: None}) as release:
        yield release


@pytest.fixture(scope="module")
def poller(cluster: Cluster, release: Release) -> Iterator[ModePoller]:
    with ModePoller(cluster) as poller:
        yield poller


def values(host: HostSetup) -> list[str]:
    return [
        "--set", "dra.enabled=true",
        "--set", "dra.defaultMode=device-plugin",
        "--set-file", f"config.map.dp={DATA / 'mode-dp.yaml'}",
        "--set-file", f"config.map.dra={DATA / 'mode-dra.yaml'}",
        "--set", "config.default=dp",
        "--set", f"nvidiaDriverRoot={host.driver_root}",
        "--set", "nvidiaDevRoot=/",
        "--set", f"cdi.nvidiaHookPath={host.hook}",
    ]  # fmt: skip


def logs(cluster: Cluster, release: Release) -> str:
    return "\n".join([release.logs("device-plugin"), release.logs("dra-plugin")])


def node_events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=Node,involvedObject.name={cluster.node},reason={reason}"
    found: list[dict[str, Any]] = cluster.kubectl_json("get", "events", "-A", "--field-selector",
                                                       selector)["items"]
    return found


def event_naming(cluster: Cluster, reason: str, text: str) -> dict[str, Any] | None:
    return next((e for e in node_events(cluster, reason) if text in e["message"]), None)


def node_slices(cluster: Cluster) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={cluster.node},spec.driver={DRIVER}"
    found: list[dict[str, Any]] = cluster.kubectl_json("get", "resourceslices", "--field-selector",
                                                       selector)["items"]
    return found


def switch(cluster: Cluster, release: Release, poller: ModePoller, timings: Timings, entry: str,
           done: Any, what: str) -> tuple[float, list[Sample]]:
    """Label the node for `entry`, wait until `done(sample)`, sample TAIL_S more; the seconds to get
    there and the samples from the label on. Never both; neither only before `done`."""
    start = time.monotonic()
    cluster.label({LABEL: entry})

    def reached() -> float | None:
        latest = poller.latest()
        return latest.at if latest is not None and latest.at > start and done(latest) else None

    def diagnose() -> str:
        return f"{describe(poller.since(start), start)}\n{logs(cluster, release)}"

    shown, _ = cluster.wait_for(what, reached, timeout=SWITCH_S, every=0.2, diagnose=diagnose)
    time.sleep(TAIL_S)
    samples = poller.since(start)
    print(f"label {entry}: {describe(samples, start)}")
    assert poller.errors == 0, f"the poller's GETs failed: {poller.errors}, last {poller.last_error}"
    assert not [s for s in samples if both(s)], f"advertised through both APIs: {describe(samples, start)}"
    after = [s for s in samples if s.at >= shown]
    assert all(done(s) for s in after), f"left the new mode after reaching it: {describe(samples, start)}"
    gap = [s for s in samples if neither(s)]
    timings.add(SCENARIO, f"label {entry}: {what} (then {TAIL_S:.0f} s sampled every 0.2 s)", shown - start)
    timings.add(SCENARIO, f"label {entry}: neither API advertised (samples)",
                (gap[-1].at - gap[0].at + poller.every) if gap else 0.0)
    return shown - start, samples


def gpu_pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": WORK},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                                 "command": ["sleep", "infinity"], "resources": {"limits": {GPU: "1"}}}]},
    }  # fmt: skip


def claim_pod(name: str, image: str) -> list[dict[str, Any]]:
    template = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": WORK},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                                                    "exactly": {"deviceClassName": DRIVER}}]}}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": WORK},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "automountServiceAccountToken": False,
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                 "containers": [{"name": "cuda", "image": image, "imagePullPolicy": "Never",
                                 "command": ["sleep", "infinity"],
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
    }  # fmt: skip
    return [template, pod]


def running(cluster: Cluster, name: str) -> bool:
    pod = cluster.kubectl_json("get", "pod", "-n", WORK, name)
    return bool(pod["status"].get("phase") == "Running")


# --- the story ----------------------------------------------------------------------------------------


def test_install_serves_the_default_mode(cluster: Cluster, release: Release, host: HostSetup,
                                         poller: ModePoller, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (dra.enabled, two entries, default dp)"):
        done = release.install(*values(host), check=False)
    if done.returncode != 0:
        pods = cluster.kubectl("get", "pods", "-n", release.namespace, "-o", "wide", check=False).stdout
        raise AssertionError(f"helm install failed:\n{done.stderr[-2000:]}\n{pods}\n{logs(cluster, release)}")
    assert release.pods("device-plugin") and release.pods("dra-plugin")
    _, seconds = cluster.wait_for("allocatable 1 from the device plugin", lambda: dp_mode(poller.latest()),
                                  60, diagnose=lambda: logs(cluster, release))
    timings.add(SCENARIO, "installed -> allocatable 1 (device-plugin mode)", seconds)
    assert "This node is in device-plugin mode" in release.logs("dra-plugin")


def test_device_plugin_to_dra(cluster: Cluster, release: Release, poller: ModePoller, timings: Timings
                              ) -> None:
    seconds, samples = switch(cluster, release, poller, timings, "dra", dra_mode,
                              "the DRA plugin's slice, allocatable 0")
    after = [s for s in samples if dra_mode(s)]
    # What the Node says right after: the kubelet keeps the stopped plugin's capacity for its 5-minute
    # grace, with allocatable 0; the DRA plugin published once allocatable showed 0.
    print(f"device-plugin -> dra in {seconds:.1f} s; right after: allocatable {after[0].allocatable}, "
          f"capacity {after[0].capacity}")
    assert after[0].allocatable == 0
    event, _ = cluster.wait_for("a ModeSwitched Event",
                                lambda: event_naming(cluster, "ModeSwitched", "device-plugin -> dra"), 30)
    assert event["type"] == "Normal" and event["source"]["component"] == "nvidia-dra-plugin"
    assert "Advertising nothing: this node is in DRA mode" in release.logs("device-plugin")


def test_dra_to_device_plugin(cluster: Cluster, release: Release, poller: ModePoller, timings: Timings
                              ) -> None:
    switch(cluster, release, poller, timings, "dp", dp_mode, "allocatable 1, no slice")
    event, _ = cluster.wait_for("a ModeSwitched Event",
                                lambda: event_naming(cluster, "ModeSwitched", "dra -> device-plugin"), 30)
    assert event["source"]["component"] == "nvidia-device-plugin"


def test_a_gpu_pod_holds_the_switch_until_it_goes(cluster: Cluster, release: Release, images: Images,
                                                  poller: ModePoller, timings: Timings) -> None:
    cluster.apply(gpu_pod("holder", images.plugin))
    cluster.wait_for("pod holder Running", lambda: running(cluster, "holder"), 90)
    start = time.monotonic()
    cluster.label({LABEL: "dra"})

    def refused() -> dict[str, Any] | None:
        return event_naming(cluster, "ModeSwitchRefused", f"{WORK}/holder")

    event, seconds = cluster.wait_for("a ModeSwitchRefused Event naming the pod", refused, 30,
                                      diagnose=lambda: logs(cluster, release))
    timings.add(SCENARIO, "label dra with a GPU pod -> ModeSwitchRefused Event", seconds)
    assert event["type"] == "Warning" and event["source"]["component"] == "nvidia-device-plugin"
    assert f"{WORK}/holder (nvidia.com/gpu)" in event["message"], event["message"]
    time.sleep(TAIL_S + 5)  # past a retry and a node status
    samples = poller.since(start)
    assert all(dp_mode(s) for s in samples), f"the refused switch moved: {describe(samples, start)}"
    named = [e for e in node_events(cluster, "ModeSwitchRefused") if f"{WORK}/holder" in e["message"]]
    assert len(named) == 1, named
    deleted = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", WORK, "holder", "--wait=true", timeout=90)
    _, seconds = cluster.wait_for("the switch to DRA by itself", lambda: dra_mode(poller.latest()), SWITCH_S,
                                  every=0.2, diagnose=lambda: logs(cluster, release))
    timings.add(SCENARIO, "GPU pod deleted (after it is gone) -> DRA mode by itself", seconds)
    samples = poller.since(deleted)
    assert not [s for s in samples if both(s)], describe(samples, deleted)


def test_a_claim_holds_the_switch_back_until_it_goes(cluster: Cluster, release: Release, images: Images,
                                                     poller: ModePoller, timings: Timings) -> None:
    cluster.apply(claim_pod("claimer", images.plugin))
    cluster.wait_for("pod claimer Running", lambda: running(cluster, "claimer"), 120,
                     diagnose=lambda: logs(cluster, release))
    start = time.monotonic()
    cluster.label({LABEL: "dp"})

    def refused() -> dict[str, Any] | None:
        return event_naming(cluster, "ModeSwitchRefused", f"{WORK}/claimer")

    event, seconds = cluster.wait_for("a ModeSwitchRefused Event naming the claim's pod", refused, 30,
                                      diagnose=lambda: logs(cluster, release))
    timings.add(SCENARIO, "label dp with a claim pod -> ModeSwitchRefused Event", seconds)
    assert event["source"]["component"] == "nvidia-dra-plugin"
    assert "(claim claimer-gpu-" in event["message"], event["message"]
    time.sleep(TAIL_S)
    samples = poller.since(start)
    assert all(dra_mode(s) for s in samples), f"the refused switch moved: {describe(samples, start)}"
    deleted = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", WORK, "claimer", "--wait=true", timeout=90)
    _, seconds = cluster.wait_for("the switch back by itself", lambda: dp_mode(poller.latest()), SWITCH_S,
                                  every=0.2, diagnose=lambda: logs(cluster, release))
    timings.add(SCENARIO, "claim pod deleted (after it is gone) -> device-plugin mode by itself", seconds)
    samples = poller.since(deleted)
    assert not [s for s in samples if both(s)], describe(samples, deleted)
    assert "Traceback" not in logs(cluster, release)


def test_uninstall_stops_the_plugins(cluster: Cluster, release: Release, timings: Timings) -> None:
    cluster.label({LABEL: "dra"})
    cluster.wait_for("the slice", lambda: bool(node_slices(cluster)), SWITCH_S)
    with timings.measure(SCENARIO, "helm uninstall --wait"):
        release.uninstall()
    cluster.wait_for("the release's pods to go", lambda: not release.pods(), 90)
    # The kubelet deletes the slices 30 s after the driver's registration goes: tests/e2e/test_dra.py
    # waits that out; this story's plugin is gone, which is what nvdp does.
