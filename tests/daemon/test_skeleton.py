"""The daemon skeleton's process shape (nvdp.daemon.skeleton): start, config switches on wake-ups,
start failures, the way out, and who records which Event. No process is started: the loop runs on
this thread and the work posts its own wake-ups."""

from __future__ import annotations

import logging

import pytest

from nvdp.daemon.errors import CannotGoOn
from nvdp.daemon.pernode.nodechoice import ConfigRefused
from nvdp.daemon.pernode.nodeconfig import Chosen
from nvdp.daemon.report.recording import Recorder
from nvdp.daemon.runloop import EXIT_FAILED, EXIT_OK, Wake, Wakes
from nvdp.daemon.skeleton import DaemonWork, Skeleton

LOG = logging.getLogger("test.skeleton")


class Recording(DaemonWork):
    """Records what the skeleton asks of it; `plan` says what each switch does (None: goes in)."""

    def __init__(self, skeleton: Skeleton, plan: list[BaseException | None], wakes: list[Wake]) -> None:
        self.skeleton = skeleton
        self.plan = plan
        self.wakes = wakes  # posted one at a time: at the start, then after each step
        self.calls: list[str] = []

    def _post_next(self) -> None:
        assert self.skeleton.inbox is not None
        if self.wakes:
            self.skeleton.inbox.post(self.wakes.pop(0))

    def switch(self, chosen: Chosen | None) -> None:
        self.calls.append("switch")
        outcome = self.plan.pop(0) if self.plan else None
        if outcome is not None:
            raise outcome

    def begin(self) -> int | None:
        self.calls.append("begin")
        self._post_next()
        return None

    def start_failed(self, err: Exception) -> int | None:
        self.calls.append(f"start_failed {type(err).__name__}")
        return 3

    def replanning(self, why: str, *, retry: bool) -> None:
        self.calls.append(f"replanning {why}")

    def step(self, wakes: Wakes) -> int | None:
        self.calls.append("step")
        self._post_next()
        return None

    def finish(self, code: int) -> int:
        self.calls.append(f"finish {code}")
        return code

    def stop(self) -> None:
        self.calls.append("stop")


def run(plan: list[BaseException | None], wakes: list[Wake]) -> tuple[int, list[str]]:
    skeleton = Skeleton("nvidia-device-plugin", LOG, {}, guard=False)
    work = Recording(skeleton, plan, wakes)
    return skeleton.run(work), work.calls


def test_a_sighup_switches_again_and_a_stop_ends_the_loop() -> None:
    code, calls = run([], [Wake.RELOAD, Wake.STOP])
    assert code == EXIT_OK
    assert calls == ["switch", "begin", "replanning Received SIGHUP", "switch", "step", "finish 0", "stop"]


def test_a_refused_reload_keeps_the_loop_going() -> None:
    code, calls = run([None, ConfigRefused("bad entry")], [Wake.RELOAD, Wake.STOP])
    assert code == EXIT_OK
    assert calls.count("switch") == 2 and "step" in calls and calls[-1] == "stop"


def test_a_first_config_refused_is_the_daemons_start_failure_and_its_work_is_stopped() -> None:
    code, calls = run([ConfigRefused("bad file")], [])
    assert code == 3
    assert calls == ["switch", "start_failed ConfigRefused", "stop"]


class Unusable(CannotGoOn):
    prefix = "cannot start: "


def test_a_daemon_that_cannot_go_on_exits_1_naming_why(caplog: pytest.LogCaptureFixture) -> None:
    code, calls = run([None, Unusable("the MPS root is read-only")], [Wake.RELOAD])
    assert code == EXIT_FAILED
    assert "cannot start: the MPS root is read-only" in caplog.messages
    assert "step" not in calls and calls[-1] == "stop"


def test_the_loop_waits_no_longer_than_the_work_asks() -> None:
    class Soon(Recording):
        def wake_after(self) -> float | None:
            return 0.0

    skeleton = Skeleton("nvidia-device-plugin", LOG, {}, guard=False)
    work = Soon(skeleton, [], [])
    steps = 0

    def step(wakes: Wakes) -> int | None:
        nonlocal steps
        steps += 1
        assert wakes.timed_out  # woken by the timeout, not by a wake-up
        return EXIT_OK if steps == 2 else None

    work.step = step  # type: ignore[method-assign]
    assert skeleton.run(work) == EXIT_OK


class Writer:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def record(self, event_type: str, reason: str, message: str) -> None:
        self.sent.append(reason)

    def node_seen(self, uid: str) -> None: ...

    def close(self, timeout: float = 2.0) -> None: ...


@pytest.mark.parametrize(("owner", "sent"), [
    ("nvidia-device-plugin", ["InvalidConfig", "ModeSwitched", "MPSDaemonNotReady"]),
    ("nvidia-dra-plugin", ["InvalidConfig", "ModeSwitched"]),
    ("gpu-feature-discovery", ["InvalidConfig"]),
    (None, ["InvalidConfig", "ModeSwitched", "MPSDaemonNotReady"]),
])
def test_a_daemon_records_only_the_event_reasons_it_owns(owner: str | None, sent: list[str]) -> None:
    writer = Writer()
    recorder = Recorder(writer, owner=owner)
    for reason in ("InvalidConfig", "ModeSwitched", "MPSDaemonNotReady"):
        recorder.event(reason, "message")
    assert writer.sent == sent
