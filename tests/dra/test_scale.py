"""The dynamic MIG scale warning: the rule and the message (nvdp.dra.pool.scale), the API server's
version as read (nvdp.kube.version), and the DRA plugin's once-per-start guard (nvdp.dra.scale)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from nvdp.config.loader import load_config
from nvdp.dra.pool.contents import pool_devices
from nvdp.dra.pool.scale import (
    SCALE_EVENT,
    SCHEDULER_FIX,
    SCHEDULER_FIX_TEXT,
    in_force,
    lacks_fix,
    scale_warning,
    silenced,
)
from nvdp.dra.scale import ScaleGuard
from nvdp.kube.version import ServerVersion, parse_version
from tests.dra.test_partitions import h100, node

CHART = Path(__file__).resolve().parents[2] / "charts" / "nvidia-device-plugin"


def dynamic(**more: object) -> Any:
    return load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra", **more})


@pytest.mark.parametrize(("info", "release"), [
    ({"major": "1", "minor": "36", "gitVersion": "v1.36.2"}, (1, 36, 2)),
    ({"major": "1", "minor": "37", "gitVersion": "v1.37.0-rc.1"}, (1, 37, 0)),
    ({"major": "1", "minor": "36+", "gitVersion": "v1.36.2-gke.1000"}, (1, 36, 2)),
    ({"major": "1", "minor": "36+", "gitVersion": "v1.36.2+k3s1"}, (1, 36, 2)),
    ({"major": "1", "minor": "38+", "gitVersion": "custom"}, (1, 38, 0)),
    ({"gitVersion": "unknown"}, None),
    ("not an object", None),
])
def test_the_api_servers_version_is_read_from_git_version_else_major_and_minor(
        info: object, release: tuple[int, int, int] | None) -> None:
    assert parse_version(info).release == release


def test_releases_before_the_fix_lack_it() -> None:
    assert SCHEDULER_FIX == (1, 37, 0) and SCHEDULER_FIX_TEXT == "1.37.0"
    assert lacks_fix((1, 36, 2)) and lacks_fix((1, 34, 9))
    assert not lacks_fix((1, 37, 0)) and not lacks_fix((1, 38, 1)) and not lacks_fix(None)


def test_the_message_says_the_cost_and_the_way_out_within_an_events_length() -> None:
    message = scale_warning("v1.36.2", (1, 36, 2), 208)
    assert message is not None and len(message) <= 1024  # an Event's message is cut at 1024
    for words in ("208 partitionable devices", "Kubernetes v1.36.2", "before 1.37.0",
                  "kubernetes/kubernetes#138917", "0.4 / 4.9 / 32.7 s per pod at 50 / 200 / 500",
                  "8 / 11 / 20 ms", "1.7 pods/s", "114 without", "Kubernetes 1.37.0 or later",
                  "flags.migDynamicProfiles", "small clusters", "dra.dynamicMigScaleWarning=false",
                  "NVDP_DYNAMIC_MIG_SCALE_WARNING=false"):
        assert words in message, words
    assert scale_warning("v1.37.0", (1, 37, 0), 208) is None
    assert scale_warning("v1.36.2", (1, 36, 2), 0) is None
    assert scale_warning("custom", None, 208) is None


def test_dynamic_mig_is_in_force_where_the_node_publishes_counters_in_dra_mode() -> None:
    devices = pool_devices(dynamic(), node(h100(0), h100(1)))
    assert in_force(dynamic(), "dra", devices) == 52
    assert in_force(dynamic(), "device-plugin", devices) == 0
    assert in_force(load_config(None, {}, {"flags.mode": "dra"}), "dra", devices) == 0
    fewer = dynamic(**{"flags.migDynamicProfiles": ["1g.10gb", "3g.40gb"]})
    assert in_force(fewer, "dra", pool_devices(fewer, node(h100()))) == 10


@pytest.mark.parametrize(("value", "off"), [("false", True), ("False", True), ("0", True), ("no", True),
                                            ("true", False), ("", False)])
def test_the_chart_value_silences_it_through_the_environment(value: str, off: bool) -> None:
    assert silenced({"NVDP_DYNAMIC_MIG_SCALE_WARNING": value}) is off


def test_the_notes_mirror_the_fixed_version() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    (mirrored,) = re.findall(r'\$schedulerFix := "([0-9.]+)"', notes)
    assert mirrored == SCHEDULER_FIX_TEXT
    values = (CHART / "values.yaml").read_text()
    assert f"older than {SCHEDULER_FIX_TEXT}" in values


# --- the plugin's guard ----------------------------------------------------------------------------


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def event(self, reason: str, message: str, *, warning: bool = True) -> None:
        self.sent.append((reason, message))


class Api:
    """Stands in for the client: `versions` answered in turn (an exception is raised)."""

    def __init__(self, *versions: object) -> None:
        self.versions = list(versions)
        self.calls = 0

    def client(self) -> object:
        return self

    def read(self, _client: object) -> ServerVersion:
        self.calls += 1
        answer = self.versions.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, str)
        return parse_version({"gitVersion": answer})


def guard(api: Api, env: dict[str, str] | None = None) -> tuple[ScaleGuard, Events]:
    events = Events()
    return ScaleGuard(api.client, events, logging.getLogger("test.scale"), env or {}), events  # type: ignore[arg-type]


def checked(g: ScaleGuard, config: Any, mode: str = "dra") -> None:
    g.check(config, mode, pool_devices(config, node(h100())))  # type: ignore[arg-type]
    if g.thread is not None:
        g.thread.join(10)


def test_the_guard_warns_once_per_start(monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    api = Api("v1.36.2")
    monkeypatch.setattr("nvdp.kube.get_server_version", api.read)
    g, events = guard(api)
    with caplog.at_level(logging.WARNING, logger="test.scale"):
        for _ in range(3):  # a SIGHUP, a per-node switch: the same start
            checked(g, dynamic())
    assert api.calls == 1 and [reason for reason, _ in events.sent] == [SCALE_EVENT]
    assert [r.getMessage() for r in caplog.records] == [events.sent[0][1]]
    assert "26 partitionable devices" in events.sent[0][1]


def test_a_fixed_control_plane_gets_no_warning_and_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api("v1.37.1")
    monkeypatch.setattr("nvdp.kube.get_server_version", api.read)
    g, events = guard(api)
    checked(g, dynamic())
    checked(g, dynamic())
    assert api.calls == 1 and events.sent == []


def test_a_failed_read_is_tried_again_with_the_next_config(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    api = Api(TimeoutError("timed out"), "v1.36.2")
    monkeypatch.setattr("nvdp.kube.get_server_version", api.read)
    g, events = guard(api)
    with caplog.at_level(logging.WARNING, logger="test.scale"):
        checked(g, dynamic())
    assert "Cannot read the API server's version" in caplog.text and events.sent == []
    checked(g, dynamic())
    assert api.calls == 2 and len(events.sent) == 1


def test_no_read_where_dynamic_mig_is_not_in_force_or_the_warning_is_silenced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api("v1.36.2", "v1.36.2")
    monkeypatch.setattr("nvdp.kube.get_server_version", api.read)
    g, events = guard(api)
    checked(g, load_config(None, {}, {"flags.mode": "dra"}))
    checked(g, dynamic(), mode="device-plugin")
    quiet, quiet_events = guard(api, {"NVDP_DYNAMIC_MIG_SCALE_WARNING": "false"})
    checked(quiet, dynamic())
    assert api.calls == 0 and events.sent == [] and quiet_events.sent == []
    checked(g, dynamic())  # a later per-node switch into dynamic MIG: checked then
    assert api.calls == 1 and len(events.sent) == 1
