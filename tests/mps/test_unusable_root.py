"""The real MPS daemon process when its MPS root cannot be used: it says so and never dies silently."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.mps.paths import ResourcePaths
from nvdp.mps.status import read_status

from .processes import MpsNode, Proc
from .waiting import wait_for

pytestmark = pytest.mark.slow

T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
FIX = (
    "fix: make it a writable directory on the node (move away the file in the way, or remount it "
    "read-write), or set flags.mpsRoot (chart value mps.root) to another directory"
)


@pytest.fixture
def node(mps_root: Path) -> Iterator[MpsNode]:
    n = MpsNode(mps_root)
    yield n
    n.stop()


def paths(node: MpsNode) -> ResourcePaths:
    return ResourcePaths(node.mps_root, "nvidia.com/gpu")


def test_root_under_a_regular_file_stops_the_daemon_with_the_fix(node: MpsNode) -> None:
    node.mps_root.write_text("not a directory\n")
    daemon = node.start_daemon()
    assert daemon.wait() == 1, daemon.output()
    out = daemon.output()
    assert (
        f"cannot start: the MPS root {node.mps_root} is unusable: {node.mps_root} is a file, not a "
        f"directory; {FIX}" in out
    ), out
    assert "Traceback" not in out
    # Checked before any GPU was switched to EXCLUSIVE_PROCESS.
    assert node.node.compute_mode(T4) == "DEFAULT"


def test_read_only_root_with_an_old_marker_stops_the_daemon_with_the_fix(node: MpsNode) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is missing: cannot make a read-only MPS root")
    old = paths(node)
    old.base.mkdir(parents=True)
    old.ready_marker.write_text("4242\n")
    root = node.mps_root
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}" && exec "$@"',
        "sh",
        sys.executable,
        "-m",
        "nvdp.mps.main",
        "--config-file",
        str(node.config),
    ]
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        reason = probe.stderr.decode().strip()
        pytest.skip(f"cannot create a mount namespace for a read-only MPS root: {reason}")
    daemon = Proc("daemon", argv, node.env, node.root / "daemon-ro.log")
    node.procs.append(daemon)
    assert daemon.wait() == 1, daemon.output()
    out = daemon.output()
    problem = f"{old.base} is on a read-only filesystem"
    assert f"cannot start: the MPS root {root} is unusable: {problem}; {FIX}" in out
    assert "Traceback" not in out
    assert node.node.compute_mode(T4) == "DEFAULT"


def test_root_lost_while_running_is_retried_visibly_and_sigterm_restores_the_mode(node: MpsNode) -> None:
    daemon = node.start_daemon()
    assert wait_for(paths(node).ready_marker.exists), daemon.output()
    assert node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"
    # The root disappears under a regular file: the daemon can neither probe nor remove its marker.
    moved = node.root / "mps-moved"
    node.mps_root.rename(moved)
    node.mps_root.write_text("in the way\n")
    blocked = f"the MPS root {node.mps_root} is unusable: {node.mps_root} is a file, not a directory; {FIX}"
    assert daemon.wait_output(f"MPS control daemon did not start: {blocked}; retrying in", count=2), (
        daemon.output()
    )
    assert daemon.running()

    # Put the root back: the supervisor, still alive, brings the daemon back by itself.
    node.mps_root.unlink()
    moved.rename(node.mps_root)
    back = wait_for(lambda: daemon.output().count("nvidia.com/gpu: ready (") == 2, limit_s=30)
    assert back, daemon.output()
    status = read_status(paths(node).status_file)
    assert status is not None and status.state == "ready"

    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.output()
    assert "Traceback" not in daemon.output()
    assert node.node.compute_mode(T4) == "DEFAULT"
    status = read_status(paths(node).status_file)
    assert status is not None and status.state == "stopped"


def test_sigterm_while_the_root_is_blocked_exits_0_with_the_mode_restored(node: MpsNode) -> None:
    daemon = node.start_daemon()
    assert wait_for(paths(node).ready_marker.exists), daemon.output()
    moved = node.root / "mps-moved"
    node.mps_root.rename(moved)
    node.mps_root.write_text("in the way\n")
    assert daemon.wait_output("retrying in"), daemon.output()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.output()
    assert "Traceback" not in daemon.output()
    assert node.node.compute_mode(T4) == "DEFAULT"
