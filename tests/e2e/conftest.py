"""The end-to-end suite's shared set-up: one cluster for the whole package, images, timings.

Backend: NVDP_E2E_CLUSTER=kit (default; the k8s kit's node, root and `<repo>/../shared/k8s` needed) or
kind (tests/e2e/run.sh). Without what the backend needs every test here skips with the reason. The node is
always torn down at the end, and the kit's node lock is held from set-up to tear-down.

Timings (seconds per scenario step) are printed as a table after the run and written to bench/RESULTS.md
(section "End-to-end on a real node"); they are never asserted.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .e2e_cluster import (
    ROOT,
    Cluster,
    ClusterUnavailable,
    Images,
    KindCluster,
    KitCluster,
    Timings,
    node_lock,
)

# The node profile every story's release selects unless it names another (the images carry them all).
PROFILE = os.environ.get("PROFILE", "t4")
TIMINGS = Timings()
RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- e2e-timings:begin -->", "<!-- e2e-timings:end -->"
_started: list[float] = []  # set-up began (lock held)
_finished: list[float] = []  # tear-down ended


def _backend() -> Cluster:
    kind = os.environ.get("NVDP_E2E_CLUSTER", "kit")
    if kind == "kind":
        return KindCluster(os.environ.get("CLUSTER", "nvdp-e2e"))
    if kind != "kit":
        pytest.skip(f"NVDP_E2E_CLUSTER={kind!r}: use kit or kind")
    kit = KitCluster.find_kit()
    if kit is None:
        pytest.skip(
            "end-to-end suite skipped: no k8s kit at ../shared/k8s beside the repository (or NVDP_K8S_KIT)"
        )
    if os.geteuid() != 0:
        pytest.skip("end-to-end suite skipped: the k8s kit's node needs root")
    return KitCluster(kit, Path(os.environ.get("K8S_DIR", "/tmp/nvdp-k8s")))


# Package scope: the node goes down (and its lock is released) right after the last test here, not at
# the end of the whole session.
@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    backend = _backend()
    with contextlib.ExitStack() as stack:
        if isinstance(backend, KitCluster):
            try:
                stack.enter_context(node_lock(float(os.environ.get("NVDP_E2E_LOCK_TIMEOUT", "900"))))
            except ClusterUnavailable as err:
                pytest.skip(f"end-to-end suite skipped: {err}")
        _started.append(time.monotonic())
        try:
            with TIMINGS.measure("set-up", "setup.sh (idempotent)"):
                backend.setup()
            # From here on the node may be (partly) up: always tear it down.
            stack.callback(_tear_down, backend)
            with TIMINGS.measure("set-up", "node up (FRESH)"):
                backend.up()
        except ClusterUnavailable as err:
            pytest.skip(f"end-to-end suite skipped, the cluster could not be brought up: {err}")
        yield backend


def _tear_down(backend: Cluster) -> None:
    with TIMINGS.measure("tear-down", "node down"):
        backend.down()
    _finished.append(time.monotonic())


@pytest.fixture(scope="package")
def images(cluster: Cluster) -> Images:
    with TIMINGS.measure("set-up", "images (stand-ins, every profile)"):
        return cluster.build_images(PROFILE)


@pytest.fixture(scope="session")
def timings() -> Timings:
    return TIMINGS


def _record(total_s: float) -> None:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        BEGIN,
        f"Last run: {stamp}, {os.cpu_count()}-core {platform.machine()} VM (Linux {platform.release()}), "
        f"load average at the end {load}; the end-to-end suite took {total_s:.0f} s from set-up to "
        "tear-down.",
        "",
        TIMINGS.table(),
        END,
    ])  # fmt: skip
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: section, text, flags=re.S)
    else:
        text = (
            text.rstrip("\n")
            + "\n\n## End-to-end on a real node (tests/e2e, timings recorded, not asserted)\n\n"
        )
        text += section + "\n"
    RESULTS.write_text(text, encoding="utf-8")


# Steps of one story (a module marked `incremental`) depend on the ones before: after a failure the rest
# are skipped, naming the step that failed, instead of each waiting out its own timeout.
_failed_step: dict[str, str] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if item.get_closest_marker("incremental") and call.excinfo is not None and call.when == "call":
        _failed_step.setdefault(str(item.path), item.name)
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    failed = _failed_step.get(str(item.path))
    if item.get_closest_marker("incremental") and failed:
        pytest.skip(f"an earlier step of this story failed: {failed}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TIMINGS.rows or not _started:
        return
    total = (_finished[0] if _finished else time.monotonic()) - _started[0]
    terminalreporter.write_sep("-", f"end-to-end timings (seconds; the suite took {total:.0f} s)")
    terminalreporter.write_line(TIMINGS.table())
    if os.environ.get("NVDP_E2E_RECORD") == "1":
        _record(total)
