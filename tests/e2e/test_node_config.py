"""Per-node config on a real node: two entries, the node label picks one, no plugin restart.

Installed as a user types it (`--set-file config.map.<entry>=` twice, `config.default=plain`). Labelling
the node `nvidia.com/device-plugin.config=ts` switches it to time-slicing x4 through the plugin's Node
watch: the same pod, never a moment at 0 GPUs. An unknown entry keeps the running config and says so in
an Event on the Node, listing the entries there are; removing the label goes back to the default.

The plugin runs on the pod network, as users install it, and reaches the API server through the
`kubernetes` Service (its in-cluster config).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_cluster import DATA, Cluster, Images, Release, Timings

SCENARIO = "per-node config"
pytestmark = pytest.mark.incremental
LABEL = "nvidia.com/device-plugin.config"
INSTALL = (
    "--set-file", f"config.map.ts={DATA / 'time-slicing-4.yaml'}",
    "--set-file", f"config.map.plain={DATA / 'plain.yaml'}",
    "--set", "config.default=plain",
)  # fmt: skip


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    cluster.label({"nvidia.com/gpu.present": "true", LABEL: None})
    release = Release(cluster, images, "nvdp-pnc", "nvdp-e2e-node-config")
    yield release
    release.uninstall()
    cluster.label({"nvidia.com/gpu.present": None, LABEL: None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def plugin_pod(release: Release) -> tuple[str, int, str]:
    """(UID, restart count, phase) of the one plugin pod."""
    (pod,) = release.pods("device-plugin")
    restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])
    return pod["metadata"]["uid"], restarts, pod["status"].get("phase", "")


class Switch:
    """Polls the Node while a label change takes effect, keeping every allocatable count it saw."""

    def __init__(self, cluster: Cluster, release: Release) -> None:
        self.cluster, self.release = cluster, release
        self.seen: list[int | None] = []

    def wait(self, count: int, timeout: float = 90) -> float:
        def probe() -> bool:
            self.seen.append(self.cluster.allocatable())
            return self.seen[-1] == count

        def diagnose() -> str:
            return f"seen {self.seen}\n{self.release.logs()}"

        what = f"allocatable = {count}"
        return self.cluster.wait_for(what, probe, timeout, every=0.2, diagnose=diagnose)[1]


def allocatable_for(cluster: Cluster, seconds: float) -> list[int | None]:
    """Every allocatable count the Node shows during the next `seconds`."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(cluster.allocatable())
        time.sleep(0.2)
    return seen


def node_events(cluster: Cluster) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=Node,involvedObject.name={cluster.node}"
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "events", "-A", "--field-selector", selector)[
        "items"
    ]
    return items


def test_install_two_entries_runs_the_default(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm install --wait (two entries, config.default=plain)"):
        release.install(*INSTALL)
    seconds = cluster.wait_allocatable(1, namespace=release.namespace)
    timings.add(SCENARIO, "installed -> allocatable 1 (plain)", seconds)
    assert plugin_pod(release)[1:] == (0, "Running")


def test_label_switches_to_time_slicing_without_restart(cluster: Cluster, release: Release,
                                                         timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    switch = Switch(cluster, release)
    cluster.kubectl("label", "node", cluster.node, f"{LABEL}=ts", "--overwrite")
    timings.add(SCENARIO, f"label {LABEL}=ts -> allocatable 4", switch.wait(4))
    assert all(seen in (1, 4) for seen in switch.seen), f"allocatable while switching: {switch.seen}"
    assert plugin_pod(release) == (uid, 0, "Running"), "the plugin pod was restarted for the switch"


def test_unknown_entry_keeps_the_config_and_records_an_event(cluster: Cluster, release: Release,
                                                              timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    seen: list[int | None] = []

    def unknown_event() -> dict[str, Any] | None:
        seen.append(cluster.allocatable())
        for event in node_events(cluster):
            if event.get("reason") == "UnknownConfig" and "'nope'" in event.get("message", ""):
                return event
        return None

    def diagnose() -> str:
        return f"{node_events(cluster)}\n{release.logs()}"

    what = "an UnknownConfig Event on the Node naming 'nope'"
    cluster.label({LABEL: "nope"})
    event, seconds = cluster.wait_for(what, unknown_event, timeout=60, diagnose=diagnose)
    timings.add(SCENARIO, f"label {LABEL}=nope -> Event on the Node", seconds)
    assert event["type"] == "Warning"
    assert "entries: plain, ts" in event["message"], event["message"]
    # A re-plan that should not happen gets the time a real switch takes to show: the kubelet publishes
    # allocatable with its node status, every 10 s by default.
    seen += allocatable_for(cluster, seconds=12)
    assert set(seen) == {4}, f"allocatable after the unknown label: {seen}"
    assert plugin_pod(release) == (uid, 0, "Running")
    assert "Traceback" not in release.logs()


def test_removing_the_label_goes_back_to_the_default(cluster: Cluster, release: Release,
                                                      timings: Timings) -> None:  # fmt: skip
    uid, _, _ = plugin_pod(release)
    switch = Switch(cluster, release)
    cluster.label({LABEL: None})
    timings.add(SCENARIO, f"label {LABEL} removed -> allocatable 1", switch.wait(1))
    assert all(seen in (4, 1) for seen in switch.seen), f"allocatable while switching: {switch.seen}"
    assert plugin_pod(release) == (uid, 0, "Running")


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
