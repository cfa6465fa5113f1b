"""The API edge (src/nvdp/kube) against a real kube-apiserver: watch, restart, events, labels, auth."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube.core.exceptions import ApiError

from nvdp.kube import (
    Backoff,
    EventRecorder,
    KubeConnectError,
    NodeLabels,
    NodeWatcher,
    connect,
    get_node_labels,
    patch_node_labels,
)
from tests.kube.envtest import ControlPlane

CONFIG_LABEL = "nvidia.com/device-plugin.config"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Seen:
    """Collects the watcher's callbacks; waits for a condition without sleeping blindly."""

    def __init__(self) -> None:
        self.states: list[dict[str, str]] = []
        self._cond = threading.Condition()

    def __call__(self, node: NodeLabels) -> None:
        with self._cond:
            self.states.append(dict(node.labels))
            self._cond.notify_all()

    def wait_for(self, predicate: object, timeout_s: float = 15.0) -> dict[str, str]:
        assert callable(predicate)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for state in reversed(self.states):
                    if predicate(state):
                        return state
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"condition not met in {timeout_s} s; states seen: {self.states}")
                self._cond.wait(left)


def label(plane: ControlPlane, node: str, value: str | None) -> None:
    arg = f"{CONFIG_LABEL}-" if value is None else f"{CONFIG_LABEL}={value}"
    plane.kubectl("label", "node", node, arg, "--overwrite")


def test_watch_sees_the_first_state_and_every_label_change(kube_api: ControlPlane) -> None:
    node = unique("watch")
    kube_api.create_node(node, {CONFIG_LABEL: "ts"})
    seen = Seen()
    watcher = NodeWatcher(connect(kube_api.admin_kubeconfig), node, seen)
    watcher.start()
    try:
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "ts")
        label(kube_api, node, "mps")
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "mps")
        label(kube_api, node, None)
        seen.wait_for(lambda s: CONFIG_LABEL not in s)
        # An unrelated change that leaves the labels alone is not delivered again.
        count = len(seen.states)
        kube_api.kubectl("annotate", "node", node, "example.com/x=1")
        time.sleep(1)
        assert len(seen.states) == count
    finally:
        watcher.stop()


def test_stop_returns_at_once_and_the_watch_ends_at_its_next_event(kube_api: ControlPlane) -> None:
    node = unique("stop")
    kube_api.create_node(node)
    seen = Seen()
    watcher = NodeWatcher(connect(kube_api.admin_kubeconfig), node, seen)
    watcher.start()
    seen.wait_for(lambda s: True)
    assert watcher.connected.wait(5)
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 5
    count = len(seen.states)
    label(kube_api, node, "after-stop")
    assert watcher._thread is not None
    watcher._thread.join(10)
    assert not watcher._thread.is_alive()
    assert len(seen.states) == count  # nothing delivered after stop()


def test_watch_resumes_after_the_api_server_is_killed_and_restarted(kube_api_private: ControlPlane) -> None:
    plane = kube_api_private
    node = unique("restart")
    plane.create_node(node, {CONFIG_LABEL: "a"})
    seen = Seen()
    watcher = NodeWatcher(connect(plane.admin_kubeconfig), node, seen, backoff=Backoff(0.2, 2.0))
    watcher.start()
    try:
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "a")
        plane.kill_apiserver()
        # While the server is down the watcher keeps the last state and retries without spinning.
        time.sleep(3)
        assert not watcher.connected.is_set()
        assert 1 <= watcher.failures <= 10, watcher.failures
        assert seen.states[-1].get(CONFIG_LABEL) == "a"
        plane.start_apiserver()
        assert watcher.connected.wait(15)
        label(plane, node, "b")
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "b")
    finally:
        watcher.stop()


def test_a_change_made_while_the_server_was_down_is_seen_after_it_returns(
        kube_api_private: ControlPlane) -> None:
    plane = kube_api_private
    node = unique("missed")
    plane.create_node(node, {CONFIG_LABEL: "a"})
    seen = Seen()
    watcher = NodeWatcher(connect(plane.admin_kubeconfig), node, seen, backoff=Backoff(0.2, 1.0))
    watcher.start()
    try:
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "a")
        plane.kill_apiserver()
        plane.start_apiserver()
        # The restarted server may come up before the watcher notices; either way it re-GETs.
        label(plane, node, "c")
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "c")
    finally:
        watcher.stop()


def test_a_missing_node_is_retried_not_fatal(kube_api: ControlPlane) -> None:
    node = unique("late")
    seen = Seen()
    watcher = NodeWatcher(connect(kube_api.admin_kubeconfig), node, seen, backoff=Backoff(0.2, 0.5))
    watcher.start()
    try:
        time.sleep(1)
        assert watcher.failures >= 1 and not seen.states
        kube_api.create_node(node, {CONFIG_LABEL: "x"})
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "x")
    finally:
        watcher.stop()


def node_events(plane: ControlPlane, node: str) -> list[dict[str, object]]:
    out = plane.kubectl("get", "events", "-n", "default", "-o", "json",
                        "--field-selector", f"involvedObject.kind=Node,involvedObject.name={node}").stdout
    items: list[dict[str, object]] = json.loads(out)["items"]
    return items


def test_events_show_in_describe_node_and_are_deduplicated_and_rate_limited(kube_api: ControlPlane) -> None:
    node = unique("events")
    kube_api.create_node(node)
    uid = get_node_labels(connect(kube_api.admin_kubeconfig), node).uid
    now = [0.0]
    recorder = EventRecorder(connect(kube_api.admin_kubeconfig), node, node_uid=uid, burst=2,
                             refill_s=60, dedupe_window_s=600, clock=lambda: now[0])
    assert recorder.warning("UnknownConfig", "label names 'xx'; entries: a, b")
    assert not recorder.warning("UnknownConfig", "label names 'xx'; entries: a, b")  # duplicate
    assert recorder.warning("UnknownConfig", "label names 'yy'; entries: a, b")
    assert not recorder.warning("UnknownConfig", "label names 'zz'; entries: a, b")  # bucket empty
    now[0] += 61
    assert recorder.warning("UnknownConfig", "label names 'zz'; entries: a, b")
    assert recorder.suppressed == 2
    events = node_events(kube_api, node)
    assert sorted(str(e["message"]) for e in events) == [
        f"label names '{x}'; entries: a, b" for x in ("xx", "yy", "zz")]
    assert {e["type"] for e in events} == {"Warning"}
    described = kube_api.kubectl("describe", "node", node).stdout
    assert "UnknownConfig" in described and "label names 'xx'" in described


def test_routine_events_never_use_up_what_a_problem_needs(kube_api: ControlPlane,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    node = unique("starve")
    kube_api.create_node(node)
    uid = get_node_labels(connect(kube_api.admin_kubeconfig), node).uid
    recorder = EventRecorder(connect(kube_api.admin_kubeconfig), node, node_uid=uid, clock=lambda: 0.0)
    # A busy minute of label switches: more ConfigApplied than any burst allows.
    applied = [recorder.normal("ConfigApplied", f"now serving entry-{i}") for i in range(8)]
    assert applied.count(True) == 5 and applied[-1] is False
    dropped = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert dropped[0] == (f"ConfigApplied events on node {node} reached their limit (5, then one every 60s); "
                          "not recorded: Normal: now serving entry-5")
    assert len(dropped) == 3
    # Then the problems: each still reaches the Node.
    assert recorder.warning("InvalidConfig", "config entry 'broken' is not valid YAML")
    assert recorder.warning("UnknownConfig", "the node label names 'tme-slicing'; entries: plain, shared")
    warnings = {str(e["reason"]) for e in node_events(kube_api, node) if e["type"] == "Warning"}
    assert warnings == {"InvalidConfig", "UnknownConfig"}


def test_patch_sets_and_removes_only_nvidia_labels(kube_api: ControlPlane) -> None:
    node = unique("patch")
    kube_api.create_node(node, {"example.com/keep": "yes"})
    client = connect(kube_api.admin_kubeconfig)
    after = patch_node_labels(client, node, {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.present": "true"})
    assert after.labels["nvidia.com/gpu.count"] == "4" and after.labels["example.com/keep"] == "yes"
    after = patch_node_labels(client, node, {"nvidia.com/gpu.count": None})
    assert "nvidia.com/gpu.count" not in after.labels and after.labels["nvidia.com/gpu.present"] == "true"
    with pytest.raises(ValueError, match=r"example\.com/keep"):
        patch_node_labels(client, node, {"example.com/keep": None})


def test_a_service_account_without_rbac_is_refused(kube_api: ControlPlane) -> None:
    node = unique("forbidden")
    kube_api.create_node(node)
    kubeconfig = kube_api.service_account_kubeconfig("nvdp-test", unique("sa"))
    with pytest.raises(ApiError) as err:
        get_node_labels(connect(kubeconfig), node)
    assert err.value.status.code == 403


def test_connect_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConnectError, match="set KUBECONFIG"):
        connect(service_account_dir=tmp_path)
    (tmp_path / "broken").write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(KubeConnectError):
        connect(tmp_path / "broken")


def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(1.0, 8.0, rand=lambda: 1.0)
    assert [backoff.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    backoff.reset()
    assert backoff.next() == 1.0
    low = Backoff(1.0, 8.0, rand=lambda: 0.0)
    assert [low.next() for _ in range(3)] == [0.5, 1.0, 2.0]


class Listed(list[object]):
    def __init__(self, items: list[object], resource_version: str) -> None:
        super().__init__(items)
        self.resourceVersion = resource_version


class GoneOnceClient:
    """Stands in for the API server only where a real one cannot be made to answer 410 on demand
    (its watch cache serves old resourceVersions while it can): the first watch fails with 410 Gone."""

    def __init__(self, node: str) -> None:
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Node

        self.gets = 0
        self.watches: list[str | None] = []
        self._node = Node(metadata=ObjectMeta(name=node, uid="u", resourceVersion="5",
                                              labels={CONFIG_LABEL: "a"}))
        self._changed = Node(metadata=ObjectMeta(name=node, uid="u", resourceVersion="9",
                                                 labels={CONFIG_LABEL: "b"}))
        self.closed = threading.Event()

    def list(self, res: object, fields: object) -> Listed:
        self.gets += 1
        return Listed([self._node], "7")

    def watch(self, res: object, **kwargs: object) -> Iterator[tuple[str, object]]:
        from lightkube.models.meta_v1 import Status

        self.watches.append(str(kwargs.get("resource_version")))
        if len(self.watches) == 1:
            gone = Status(code=410, reason="Expired", message="too old resource version: 5 (8)")
            raise ApiError(status=gone)
        yield "MODIFIED", self._changed
        self.closed.wait()

    def close(self) -> None:
        self.closed.set()


def test_410_gone_starts_over_with_a_fresh_get(caplog: pytest.LogCaptureFixture) -> None:
    client = GoneOnceClient("n")
    seen = Seen()
    watcher = NodeWatcher(client, "n", seen, backoff=Backoff(0.01, 0.02))  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="nvdp.kube"):
        watcher.start()
        seen.wait_for(lambda s: s.get(CONFIG_LABEL) == "b")
        watcher.stop()
    # Each watch starts at the list's resourceVersion (7), not the Node's own (5).
    assert client.gets == 2 and client.watches == ["7", "7"]
    assert [s[CONFIG_LABEL] for s in seen.states] == ["a", "b"]
    assert any("410 Expired: too old resource version" in r.getMessage() for r in caplog.records)


# -- the API server's version ------------------------------------------------------------------------
def test_the_server_version_is_read_by_any_service_account(kube_api: ControlPlane) -> None:
    """GET /version needs no RBAC of the chart's: every authenticated identity may read it."""
    import subprocess

    from nvdp.kube import get_server_version

    binary = kube_api.assets / "kube-apiserver"
    shown = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    expected = shown.split()[-1]  # "Kubernetes v1.36.2"
    account = kube_api.service_account_kubeconfig("default", unique("version-reader"))
    for kubeconfig in (kube_api.admin_kubeconfig, account):
        found = get_server_version(connect(kubeconfig))
        assert found.text == expected and found.release is not None
        assert ".".join(str(n) for n in found.release) == expected.removeprefix("v").split("-")[0]
