"""Per-node config on a real node: three entries, the node label picks one, no plugin restart.

Installed as a user types it (`--set-file config.map.<entry>=` three times, `config.default=plain`),
the plugin and the MPS daemon on the pod network, reaching the API server through the `kubernetes`
Service. The node carries `nvidia.com/mps.capable=true` from the start (as in test_mps.py), so the MPS
daemon runs beside the plugin, idle until the label picks the MPS entry.

A background poller reads the Node's allocatable nvidia.com/gpu through the API every 0.2 s for the
whole story. Each switch (plain <-> time-slicing x4 <-> MPS x10) keeps its samples from the label
change until one node-status period after the new count showed, prints them with min and max, and
records them in the timings; beside them, what the kubelet's device manager logged meanwhile.

The kubelet publishes allocatable with its node status, every 10 s: a moment without devices inside
the kubelet reaches the API only if a status falls into it, so the poller alone would miss most. The
kubelet's own log says what happened (on the kit, at --v=2): "ListAndWatch ended" when the plugin's
stream for the resource ends, then "Mark all resources Unhealthy" (healthy 0, capacity unchanged)
until a new registration sends its list.

- plain <-> time-slicing: the resource's settings change and its stream stays open: the kubelet never
  sees it end and never holds a healthy count other than the old or new one; allocatable is only
  ever the old or the new count, and so is capacity.
- to or from MPS: the resource is made anew, because an MPS resource has a readiness gate on its
  daemon: the kubelet sees the stream end once and one new registration, with healthy 0 in between
  (seen: 20-65 ms; about 0.5 s to MPS when the plugin waited for the daemon, and from MPS when the
  daemon stopped first and the gate reported the devices Unhealthy before the switch). What holds and is
  asserted: at most one stream end and one registration; allocatable is the old count, the new count
  or 0, and a 0 that reaches the API lasts at most one node-status period plus the new resource's
  start; capacity is the old or the new count (the devices are never gone); once the new count showed
  it stays. (Those gaps are far shorter than the 10 s status period, so a 0 seldom reaches the API.)

An unknown entry keeps the running config and says so in an Event on the Node, listing the entries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import (
    DATA,
    Cluster,
    Images,
    KubeletView,
    NodePoller,
    Release,
    Timings,
    Window,
    device_plugin_lines,
)

SCENARIO = "per-node config"
pytestmark = pytest.mark.incremental
LABEL = "nvidia.com/device-plugin.config"
MPS_LABEL = "nvidia.com/mps.capable"
INSTALL = (
    "--set-file", f"config.map.ts={DATA / 'time-slicing-4.yaml'}",
    "--set-file", f"config.map.plain={DATA / 'plain.yaml'}",
    "--set-file", f"config.map.mps={DATA / 'mps-10.yaml'}",
    "--set", "config.default=plain",
)  # fmt: skip
COUNT = {"plain": 1, "ts": 4, "mps": 10}
# The kubelet computes its node status every 10 s (nodeStatusUpdateFrequency): a count it publishes
# after a switch has shown within one period of the change, and one period after the new count
# showed, any later change would have shown too.
NODE_STATUS_S = 10.0
TAIL_S = NODE_STATUS_S + 1.0
# How long a 0 may last in the API across a switch that makes the resource anew: it shows only if a
# node status fell into the kubelet's gap, and the next status, one period later, has the new count;
# the margin is for a new resource that starts slowly (its MPS gate polls the daemon's marker).
GAP_S = NODE_STATUS_S + 5.0


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true", MPS_LABEL: "true", LABEL: None})
    release = Release(cluster, images, "nvdp-pnc", "nvdp-e2e-node-config")
    yield release
    release.uninstall()
    cluster.label({"nvidia.com/gpu.present": None, MPS_LABEL: None, LABEL: None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def poller(cluster: Cluster, release: Release) -> Iterator[NodePoller]:
    with NodePoller(cluster, every=0.2) as poller:
        yield poller


def plugin_pod(release: Release) -> tuple[str, int, str]:
    """(UID, restart count, phase) of the one plugin pod."""
    (pod,) = release.pods("device-plugin")
    restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])
    return pod["metadata"]["uid"], restarts, pod["status"].get("phase", "")


def node_events(cluster: Cluster) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=Node,involvedObject.name={cluster.node}"
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "events", "-A", "--field-selector", selector)[
        "items"
    ]
    return items


class Switched:
    """One switch as the API (the poller's samples) and the kubelet (its log) saw it."""

    def __init__(self, window: Window, kubelet: KubeletView) -> None:
        self.window, self.kubelet = window, kubelet

    def describe(self) -> str:
        return f"{self.window.describe()}\n  {self.kubelet.describe(self.window.allowed)}"


def switch(cluster: Cluster, release: Release, poller: NodePoller, timings: Timings, old: str,
           new: str) -> Switched:  # fmt: skip
    """Label the node for entry `new` (the default: remove the label), wait until allocatable shows its
    count, keep sampling one node-status period more; record and print what the poller and the kubelet
    saw."""
    before, want = COUNT[old], COUNT[new]
    allowed = frozenset((before, want))
    mark = cluster.kubelet_log_mark()
    start = time.monotonic()
    cluster.label({LABEL: None if new == "plain" else new})

    def reached() -> float | None:
        latest = poller.latest()
        return latest.at if latest is not None and latest.at > start and latest.allocatable == want else None

    def diagnose() -> str:
        window = Window(f"{old} -> {new}", start, poller.since(start), allowed)
        return f"{window.describe()}\npoller errors {poller.errors} {poller.last_error}\n{release.logs()}"

    shown, _ = cluster.wait_for(f"allocatable {want}", reached, timeout=120, every=0.2, diagnose=diagnose)
    time.sleep(TAIL_S)
    window = Window(f"{old} {before} -> {new} {want}", start, poller.since(start), allowed)
    switched = Switched(window, KubeletView(device_plugin_lines(cluster.kubelet_log_since(mark))))
    print(switched.describe())
    known = [value for value in window.allocatable if value is not None]
    timings.add(SCENARIO, f"label {old} -> {new}: allocatable {want} ({len(window.samples)} samples every "
                f"0.2 s, min {min(known)}, max {max(known)})", shown - start)  # fmt: skip
    gaps = switched.kubelet.without(allowed)
    timings.add(SCENARIO, f"label {old} -> {new}: kubelet without healthy devices (stream ended "
                f"{switched.kubelet.streams_ended}x)", sum(seconds for _, seconds in gaps))  # fmt: skip
    assert poller.errors == 0, f"the poller's GETs failed: {poller.errors}, last {poller.last_error}"
    assert len(window.samples) >= (shown - start + TAIL_S) / 0.5, f"too few samples: {window.describe()}"
    after = [s.allocatable for s in window.samples if s.at >= shown]
    assert set(after) == {want}, f"allocatable left {want} after showing it: {switched.describe()}"
    assert plugin_pod(release)[1:] == (0, "Running"), "the plugin pod was restarted for the switch"
    return switched


def assert_never_dropped(switched: Switched) -> None:
    """The stream stays open: only ever the old or the new count, in the kubelet and in the API."""
    window, kubelet = switched.window, switched.kubelet
    assert kubelet.streams_ended == 0, f"the kubelet saw the plugin's stream end: {switched.describe()}"
    assert not kubelet.without(window.allowed), f"the kubelet's healthy count dropped: {switched.describe()}"
    assert not window.drops(), f"allocatable dropped while switching: {switched.describe()}"
    assert {s.capacity for s in window.samples} <= window.allowed, switched.describe()


def assert_made_anew(switched: Switched) -> None:
    """Made anew once: 0 allowed, for at most GAP_S in the API; the devices never gone (capacity)."""
    window, kubelet = switched.window, switched.kubelet
    assert kubelet.streams_ended <= 1 and kubelet.registrations <= 1, switched.describe()
    drops = window.drops()
    assert all(value == 0 for value, *_ in drops), f"other than old, new or 0: {switched.describe()}"
    assert all(to - begin <= GAP_S for _, _, begin, to in drops), f"0 for too long: {switched.describe()}"
    assert {s.capacity for s in window.samples} <= window.allowed, switched.describe()


def test_install_three_entries_runs_the_default(cluster: Cluster, release: Release, poller: NodePoller,
                                                timings: Timings) -> None:  # fmt: skip
    with timings.measure(SCENARIO, "helm install --wait (three entries, config.default=plain)"):
        release.install(*INSTALL)
    seconds = cluster.wait_allocatable(1, namespace=release.namespace)
    timings.add(SCENARIO, "installed -> allocatable 1 (plain)", seconds)
    assert plugin_pod(release)[1:] == (0, "Running")
    (plugin,) = release.pods("device-plugin")
    assert not plugin["spec"].get("hostNetwork"), "the plugin runs on the pod network"
    (daemon,) = release.pods("mps-control-daemon")
    assert daemon["status"]["phase"] == "Running"
    assert "nothing to do" in release.logs("mps-control-daemon")


def test_plain_to_time_slicing_never_drops(cluster: Cluster, release: Release, poller: NodePoller,
                                           timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    assert_never_dropped(switch(cluster, release, poller, timings, "plain", "ts"))
    assert plugin_pod(release)[0] == uid, "the plugin pod was replaced for the switch"


def test_unknown_entry_keeps_the_config_and_records_an_event(
    cluster: Cluster, release: Release, poller: NodePoller, timings: Timings
) -> None:
    uid, _, _ = plugin_pod(release)

    def unknown_event() -> dict[str, Any] | None:
        for event in node_events(cluster):
            if event.get("reason") == "UnknownConfig" and "'nope'" in event.get("message", ""):
                return event
        return None

    def diagnose() -> str:
        return f"{node_events(cluster)}\n{release.logs()}"

    what = "an UnknownConfig Event on the Node naming 'nope'"
    start = time.monotonic()
    cluster.label({LABEL: "nope"})
    event, seconds = cluster.wait_for(what, unknown_event, timeout=60, diagnose=diagnose)
    timings.add(SCENARIO, f"label {LABEL}=nope -> Event on the Node", seconds)
    assert event["type"] == "Warning"
    assert "entries: mps, plain, ts" in event["message"], event["message"]
    # A re-plan that should not happen gets the time a real switch takes to show.
    time.sleep(TAIL_S)
    window = Window("ts 4 -> nope (stays 4)", start, poller.since(start), frozenset({4}))
    print(window.describe())
    assert set(window.allocatable) == {4}, f"allocatable after the unknown label: {window.describe()}"
    assert plugin_pod(release) == (uid, 0, "Running")
    assert "Traceback" not in release.logs()


def test_time_slicing_to_mps(cluster: Cluster, release: Release, poller: NodePoller,
                             timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    assert_made_anew(switch(cluster, release, poller, timings, "ts", "mps"))
    assert plugin_pod(release)[0] == uid


def test_mps_to_time_slicing(cluster: Cluster, release: Release, poller: NodePoller,
                             timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    assert_made_anew(switch(cluster, release, poller, timings, "mps", "ts"))
    assert plugin_pod(release)[0] == uid


def test_time_slicing_to_plain_never_drops(cluster: Cluster, release: Release, poller: NodePoller,
                                           timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    assert_never_dropped(switch(cluster, release, poller, timings, "ts", "plain"))
    assert plugin_pod(release)[0] == uid


def test_plain_to_mps_and_back(cluster: Cluster, release: Release, poller: NodePoller,
                               timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    assert_made_anew(switch(cluster, release, poller, timings, "plain", "mps"))
    assert_made_anew(switch(cluster, release, poller, timings, "mps", "plain"))
    assert plugin_pod(release)[0] == uid


def test_uninstall_leaves_nothing(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm uninstall --wait"):
        release.uninstall()
    cluster.wait_for("the release's pods to go", lambda: not release.pods(), 60)
    left = cluster.kubectl("get", "clusterroles,clusterrolebindings", "-l", release.selector, "-o", "name")
    named = cluster.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout.split()
    assert left.stdout.strip() == "" and not [n for n in named if release.name in n], left.stdout
    kinds = "all,configmaps,serviceaccounts,roles,rolebindings"
    rest = cluster.kubectl("get", kinds, "-n", release.namespace, "-l", release.selector, "-o", "name").stdout
    assert rest.strip() == ""
