"""Shared test set-up: make the repository's `sim` package (stand-ins for NVML, MPS and the kubelet) and
the tools in `scripts/` (image builder, code generators) importable, and keep the quick suite quick.

The suite has two speeds (`bash scripts/test.sh --quick` runs the first):
- quick: tests that start no process, API server or cluster;
- slow (`@pytest.mark.slow`): the rest. Tests that use a throwaway kube-apiserver or the kit's node are
  marked here from the fixtures they take, so no file can forget it; a test that starts a process marks
  itself, and in the quick suite (`NVDP_QUICK=1`) one that starts a process unmarked fails, naming the
  command, so the quick suite cannot slow down unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
for _path in (str(ROOT), str(ROOT / "scripts")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

# The throwaway kube-apiserver fixtures (`kube_api`, `kube_api_private`), for every test folder.
from tests.kube.envtest import kube_api, kube_api_private  # noqa: E402, F401

QUICK_ENV = "NVDP_QUICK"
# Fixtures that start a kube-apiserver or bring up the kit's node: a test taking one is slow.
SERVER_FIXTURES = frozenset({"kube_api", "kube_api_private", "cluster", "images"})
SLOW_FOLDERS = ("e2e",)


def quick_run() -> bool:
    return os.environ.get(QUICK_ENV) == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    # The stand-in NVML is compiled once, before any test, so that no quick test compiles it (a no-op
    # when it is up to date). A compiler error fails here, once, with gcc's message.
    from sim.nvml import build_library

    build_library()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.path).relative_to(ROOT / "tests").parts[0] if Path(item.path).is_relative_to(
            ROOT / "tests") else ""
        if folder in SLOW_FOLDERS or SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


class _ProcessLog:
    """The commands started while a quick test runs (its fixtures' set-up and tear-down included)."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.active = False


_started = _ProcessLog()
_original_popen_init = subprocess.Popen.__init__


def _recording_popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    if _started.active:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        _started.commands.append(" ".join(str(part) for part in argv)[:120])
    _original_popen_init(self, args, *rest, **kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    if not quick_run() or item.get_closest_marker("slow"):
        return (yield)
    subprocess.Popen.__init__ = _recording_popen_init  # type: ignore[method-assign]
    _started.active, _started.commands = True, []
    try:
        return (yield)
    finally:
        _started.active = False
        subprocess.Popen.__init__ = _original_popen_init  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "teardown" and _started.commands and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a process in the quick suite: {_started.commands[0]}"
            f"{f' (and {len(_started.commands) - 1} more)' if len(_started.commands) > 1 else ''}. "
            "Mark it @pytest.mark.slow (or the module: pytestmark = pytest.mark.slow), or test the "
            "same behaviour without a process."
        )
        _started.commands = []
    return report
