"""The turn of an MPS daemon pod on its node (nvdp.mps.node.handover): one holder runs the daemons, a
successor waits beside it, Ready only while nothing uses MPS, and takes over the moment the holder's
process ends."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvdp.daemon.pernode.mode import KubeletPod
from nvdp.mps.node.handover import (
    WAIT_FILE,
    Handover,
    Users,
    WaitReporter,
    holder_running,
    live_wait,
    read_wait,
)
from nvdp.mps.work import pods_using

LOG = logging.getLogger("test.mps.handover")


class Using:
    """A settable answer to "what uses MPS now"."""

    def __init__(self, *names: str) -> None:
        self.now = Users(names=names)

    def __call__(self) -> Users:
        return self.now


def test_the_second_pod_waits_ready_only_while_idle_and_takes_over_after_the_first(tmp_path: Path) -> None:
    base = tmp_path / "mps"
    using = Using("ns/train-0")
    old = Handover(base, "mps-old", using, LOG, tmp_path / "old.ready")
    new = Handover(base, "mps-new", using, LOG, tmp_path / "new.ready", clock=lambda: 1_000.0)
    assert old.take() and old.holding and (tmp_path / "old.ready").exists()
    assert holder_running(base)

    assert not new.take() and not new.holding
    assert not (tmp_path / "new.ready").exists()  # a pod uses MPS: the old pod must stay
    assert "ns/train-0" in (tmp_path / "new.ready.why").read_text()  # what the failing probe prints
    waiting = live_wait(base)
    assert waiting is not None and waiting.pod == "mps-new" and waiting.users.names == ("ns/train-0",)
    assert "ns/train-0" in waiting.message("node-a") and "node-a" in waiting.message("node-a")
    assert old.successor_waiting()

    using.now = Users()  # the pod ended
    assert not new.take()
    assert (tmp_path / "new.ready").exists()  # now the DaemonSet controller may retire the old pod
    again = read_wait(base)
    assert again is not None and again.users.idle and again.since == 1_000.0

    using.now = Users(names=("ns/late",))  # a pod joined the old daemon before it was retired
    assert not new.take() and not (tmp_path / "new.ready").exists()

    old.close()  # not `last`: a successor waits, and the host's files are its now
    assert not (tmp_path / "old.ready").exists() and not holder_running(base)
    assert new.take() and new.holding and (tmp_path / "new.ready").exists()
    assert not (base / WAIT_FILE).exists() and live_wait(base) is None
    new.record_resources(("nvidia.com/gpu",))
    new.close(last=True)  # the final stop of the last pod: no file of the turn stays on the host
    assert sorted(p.name for p in base.iterdir()) == []


def test_users_that_cannot_be_told_keep_the_successor_waiting(tmp_path: Path) -> None:
    base = tmp_path / "mps"
    holder = Handover(base, "mps-old", Using(), LOG, None)
    assert holder.take()

    def broken() -> list[KubeletPod]:
        raise OSError("cannot ask the kubelet's pod-resources API at /x: no such file")

    unknown = pods_using({"nvidia.com/gpu"}, broken)
    assert not unknown.idle and "cannot ask the kubelet" in (unknown.unknown or "")
    successor = Handover(base, "mps-new", lambda: unknown, LOG, tmp_path / "ready")
    assert not successor.take() and not (tmp_path / "ready").exists()
    assert "cannot tell which pods use MPS" in (read_wait(base) or pytest.fail("no record")).message("n")
    assert not pods_using({"nvidia.com/gpu"}, None).idle  # no socket mounted: cannot tell either
    holder.close()
    successor.close()


def test_pods_using_names_only_the_pods_given_devices_of_the_mps_resources() -> None:
    pods = [KubeletPod("ml", "a", resources=("nvidia.com/gpu",)),
            KubeletPod("ml", "b", resources=("nvidia.com/gpu.shared",)),
            KubeletPod("web", "c")]
    assert pods_using({"nvidia.com/gpu"}, lambda: pods).names == ("ml/a",)
    assert pods_using(set(), lambda: pods).idle


def _turn_in_a_process(base: Path, pod: str, users: str) -> subprocess.Popen[str]:
    """A process that takes its turn at `base` (users: "" idle, else one pod) and says how it went."""
    script = ("import logging, time; from pathlib import Path;"
              " from nvdp.mps.node.handover import Handover, Users;"
              f"h = Handover(Path({str(base)!r}), {pod!r},"
              f" lambda: Users(names=tuple(filter(None, [{users!r}]))), logging.getLogger('x'), None);"
              "print('holding' if h.take() else 'waiting', flush=True); time.sleep(60)")
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_killed_pods_leave_no_turn_behind(tmp_path: Path) -> None:
    base = tmp_path / "mps"
    old = _turn_in_a_process(base, "old", "")
    stale: subprocess.Popen[str] | None = None
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == "holding"
        stale = _turn_in_a_process(base, "stale", "ns/p")
        assert stale.stdout is not None and stale.stdout.readline().strip() == "waiting"
        assert live_wait(base) is not None
        stale.send_signal(signal.SIGKILL)
        stale.wait(10)
        assert (base / WAIT_FILE).exists() and live_wait(base) is None  # a killed successor waits for nothing

        successor = Handover(base, "new", Users, LOG, None)
        assert holder_running(base) and not successor.take()
        old.send_signal(signal.SIGKILL)
        old.wait(10)
        assert successor.take(), "the kernel drops a killed process's flock"
        successor.close()
    finally:
        for proc in (old, stale):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_the_plugins_event_names_the_waiting_pod_and_its_pods_once_per_change(tmp_path: Path) -> None:
    base = tmp_path / "mps"
    events: list[tuple[str, str]] = []
    reporter = WaitReporter(base, "node-a", lambda reason, message: events.append((reason, message)))
    holder = Handover(base, "mps-old", Using(), LOG, None)
    assert holder.take()
    reporter.check()
    assert events == []
    using = Using("ml/train-0", "ml/train-1")
    successor = Handover(base, "mps-new", using, LOG, None)
    assert not successor.take()
    reporter.check()
    reporter.check()
    assert len(events) == 1 and events[0][0] == "MPSUpgradeWaiting"
    assert "mps-new" in events[0][1] and "ml/train-0, ml/train-1" in events[0][1] and "node-a" in events[0][1]
    using.now = Users(names=("ml/train-1",))
    assert not successor.take()
    reporter.check()
    assert len(events) == 2 and "ml/train-0" not in events[1][1]
    using.now = Users()  # idle: no Event; the new pod takes over
    assert not successor.take()
    reporter.check()
    assert len(events) == 2
    holder.close()
    successor.close()
