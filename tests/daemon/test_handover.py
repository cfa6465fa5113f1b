"""The mode hand-over of both plugins (nvdp.daemon.handover), without processes or an API server."""

from __future__ import annotations

import logging
from collections.abc import Callable

from nvdp.daemon.handover import ModeHandover
from nvdp.daemon.pernode.mode import ModeGate, NodeApi

LOG = logging.getLogger("test.handover")


class Other:
    """The other API's hold on the node's GPUs, as the daemon's look sees it."""

    def __init__(self, holding: bool) -> None:
        self.holding = holding
        self.looks = 0

    def held(self) -> str | None:
        self.looks += 1
        return "nvidia.com/gpu=1 allocatable" if self.holding else None


def handover(other: Other, *, api: bool = True) -> tuple[ModeHandover, list[tuple[str, str]]]:
    reports: list[tuple[str, str]] = []

    def report(reason: str, message: str, *, warning: bool = True) -> None:
        reports.append((reason, message))

    node_api = NodeApi(None, "node-1", "gpu.nvidia.com") if api else None
    gate = ModeGate("dra", node_api, report, LOG)

    def waits(_api: NodeApi) -> tuple[str, Callable[[], str | None]]:
        return "the device plugin to withdraw", other.held

    return ModeHandover(gate, waits, LOG), reports


def test_entering_its_mode_waits_until_the_other_api_lets_go_then_records_the_switch_once() -> None:
    other = Other(holding=True)
    mode, reports = handover(other)
    assert not mode.enter("device-plugin")  # the other daemon's mode: nothing to wait for
    assert mode.enter("dra")  # a switch into its own mode while the device plugin still advertises
    assert mode.waiting and not mode.poll()
    other.holding = False
    assert mode.poll() and not mode.waiting
    mode.advertising()
    mode.advertising()
    assert reports == [("ModeSwitched", "device-plugin -> dra")]


def test_a_reload_while_waiting_keeps_waiting_and_one_after_the_release_looks_no_more() -> None:
    other = Other(holding=True)
    mode, _ = handover(other)
    assert mode.enter("dra")  # at start: the mode is taken, and the other API looked at
    assert mode.enter("dra")  # same mode, still waiting: looked at again
    assert other.looks == 2
    other.holding = False
    assert not mode.enter("dra") and not mode.waiting
    looks = other.looks
    assert not mode.enter("dra")  # in force and not waiting: nothing to look at
    assert other.looks == looks


def test_leaving_its_mode_ends_the_wait() -> None:
    mode, _ = handover(Other(holding=True))
    assert mode.enter("dra")
    assert not mode.enter("device-plugin")
    assert not mode.waiting and not mode.poll()


def test_without_api_access_nothing_is_waited_for() -> None:
    other = Other(holding=True)
    mode, _ = handover(other, api=False)
    assert not mode.enter("dra")
    assert other.looks == 0


def test_a_forced_look_finds_the_other_api_gone_at_once() -> None:
    other = Other(holding=False)
    mode, _ = handover(other)
    assert not mode.enter("dra", entering=True)
    assert other.looks == 1 and not mode.waiting
