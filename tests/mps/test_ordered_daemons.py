"""The MPS image carrying out the DRA plugin's orders (nvdp.mps.ordered.daemons): daemons started,
retuned in place and stopped, on the stand-in nvidia-cuda-mps-control with a compute-mode fake. The
process (`mps-control-daemon --dra-driver`) is tested in test_ordered_process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Gpu
from nvdp.mps.commands import Ceiling, MpsGpu, MpsSettings
from nvdp.mps.compute_mode import ComputeModeError
from nvdp.mps.control import PROBE_COMMAND
from nvdp.mps.ordered.daemons import LIMITS_FILE, ModesUnavailable, OrderedDaemons
from nvdp.mps.ordered.orders import (
    Applied,
    DaemonOrder,
    applied_path,
    orders_dir,
    read_applied,
    remove_order,
    write_order,
)
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.status import read_status
from sim.mps import connect_client, read_record, recorded_commands, recorded_servers

from .fakes import FakeModes
from .nodes import gpu
from .waiting import wait_for

LOG = logging.getLogger("test.mps.ordered")
DRIVER = "gpu.nvidia.com"
G0, G1 = gpu(0), gpu(1)
# Probes are not what these tests check: seldom, so the stand-in's clients do not crowd the CPU.
PROBE_S = 1.0
GREEDY = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=15360M"}


def settings(*gpus: Gpu, threads: int = 25, name: str | None = None) -> MpsSettings:
    """A DRA daemon's settings: a quarter of each 15 GiB T4's memory per 25% of threads."""
    members = tuple(MpsGpu(uuid=g.uuid, index=g.index, ordinal=i, name=g.name, memory_bytes=g.memory_bytes,
                           compute_capability=g.compute_capability, replicas=1) for i, g in enumerate(gpus))
    memory = tuple(15360 * threads // 100 for _ in gpus)
    set_name = name or (gpus[0].uuid if len(gpus) == 1 else "gpus-0123456789ab")
    return MpsSettings(resource_name=f"{DRIVER}/{set_name}", gpus=members, ceiling=Ceiling(threads, memory))


def order(generation: int, *gpus: Gpu, threads: int = 25, name: str | None = None) -> DaemonOrder:
    claims = (f"claim-{generation}",)
    return DaemonOrder(settings(*gpus, threads=threads, name=name), generation, claims=claims)


class Modes:
    """modes_factory: every compute-mode setter it made, to see when NVML is opened and closed."""

    def __init__(self) -> None:
        self.made: list[FakeModes] = []

    def __call__(self) -> FakeModes:
        self.made.append(FakeModes())
        return self.made[-1]

    @property
    def calls(self) -> list[tuple[str, list[str]]]:
        return [call for modes in self.made for call in modes.calls]


@pytest.fixture
def modes() -> Modes:
    return Modes()


@pytest.fixture
def ordered(mps_root: Path, record: Path, modes: Modes) -> Iterator[OrderedDaemons]:
    # After `record`: the stand-in stays on PATH until the daemons have stopped.
    daemons = OrderedDaemons(mps_root, DRIVER, modes, LOG, PROBE_S, recorder=Recorder())
    yield daemons
    daemons.stop()


def paths(root: Path, item: DaemonOrder) -> ResourcePaths:
    return ResourcePaths(root, item.name)


def starts(record: Path) -> list[int]:
    return [e["pid"] for e in read_record(record) if e["event"] == "start"]


def carry_out(ordered: OrderedDaemons, root: Path, item: DaemonOrder) -> None:
    """The DRA plugin's side: write the order, then one pass of the MPS image."""
    write_order(root, item)
    ordered.reconcile()


def last_ceilings(record: Path) -> tuple[str, dict[str, object]]:
    last = recorded_servers(record)[-1]
    return last["server"], last["ceilings"]


# --- one daemon -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_order_starts_a_daemon_that_gets_ready_and_its_generation_is_recorded(
        ordered: OrderedDaemons, mps_root: Path, record: Path, modes: Modes) -> None:
    first = order(1, G0)
    carry_out(ordered, mps_root, first)
    assert read_applied(paths(mps_root, first).base) == Applied(1)  # written at start, not at ready
    assert wait_for(paths(mps_root, first).ready_marker.exists)
    (pid,) = starts(record)
    assert ordered.names() == {first.name: pid}
    (start,) = [e for e in read_record(record) if e["event"] == "start"]
    assert start["env"]["CUDA_VISIBLE_DEVICES"] == G0.uuid
    # The ordered ceiling, sent before the daemon was marked ready (no client could come earlier).
    assert recorded_commands(record)[:2] == ["set_default_active_thread_percentage 25",
                                             "set_default_device_pinned_mem_limit 0 3840M"]
    assert modes.calls == [("EXCLUSIVE_PROCESS", [G0.uuid])]
    ordered.reconcile()  # the same order again: nothing happens
    assert starts(record) == [pid] and len(modes.made) == 1


@pytest.mark.slow
def test_a_new_generation_retunes_the_same_process_up_and_down(ordered: OrderedDaemons, mps_root: Path,
                                                               record: Path) -> None:
    first = order(1, G0, threads=25)
    carry_out(ordered, mps_root, first)
    assert wait_for(paths(mps_root, first).ready_marker.exists)
    pipe = paths(mps_root, first).pipe_dir
    server = connect_client(pipe, {})["server"]  # a running MPS server, which a retune must reach too
    (pid,) = starts(record)

    carry_out(ordered, mps_root, order(2, G0, threads=50))
    assert read_applied(paths(mps_root, first).base) == Applied(2)
    assert last_ceilings(record) == (server, {"thread_percentage": 50.0, "memory_mib": {"0": 7680}})
    assert connect_client(pipe, GREEDY)["thread_percentage"] == 50.0

    carry_out(ordered, mps_root, order(3, G0, threads=10))
    assert read_applied(paths(mps_root, first).base) == Applied(3)
    assert last_ceilings(record) == (server, {"thread_percentage": 10.0, "memory_mib": {"0": 1536}})
    assert connect_client(pipe, GREEDY)["memory_mib"] == {"0": 1536}
    assert starts(record) == [pid] and ordered.names() == {first.name: pid}


@pytest.mark.slow
def test_a_refused_retune_is_recorded_with_the_daemons_answer(ordered: OrderedDaemons, mps_root: Path,
                                                              record: Path) -> None:
    first = order(1, G0, threads=25)
    carry_out(ordered, mps_root, first)
    assert wait_for(paths(mps_root, first).ready_marker.exists)
    base = paths(mps_root, first).base

    carry_out(ordered, mps_root, order(2, G0, threads=0))  # the daemon refuses 0% of the threads
    applied = read_applied(base)
    assert applied is not None and applied.generation == 2
    assert applied.error is not None and "Invalid active thread percentage 0" in applied.error
    # Asked again with a new generation, the refusal is not forgotten: the daemon is asked again.
    carry_out(ordered, mps_root, order(3, G0, threads=0))
    applied = read_applied(base)
    assert applied is not None and applied.generation == 3 and applied.error is not None
    # The ceiling it had, ordered again, is sent again and taken.
    carry_out(ordered, mps_root, order(4, G0, threads=25))
    assert read_applied(base) == Applied(4)
    sent = [c for c in recorded_commands(record) if c != PROBE_COMMAND]
    assert sent[-3:] == ["get_server_list", "set_default_active_thread_percentage 25",
                         "set_default_device_pinned_mem_limit 0 3840M"]
    assert len(starts(record)) == 1


@pytest.mark.slow
def test_a_withdrawn_order_stops_its_daemon_and_restores_the_compute_mode(
        ordered: OrderedDaemons, mps_root: Path, record: Path, modes: Modes) -> None:
    first = order(1, G0)
    carry_out(ordered, mps_root, first)
    where = paths(mps_root, first)
    assert wait_for(where.ready_marker.exists)
    (where.base / LIMITS_FILE).write_text("{}\n")  # the DRA plugin's, for nvdp doctor

    remove_order(mps_root, DRIVER, first.name)
    ordered.reconcile()
    assert ordered.names() == {}
    assert modes.calls == [("EXCLUSIVE_PROCESS", [G0.uuid]), ("DEFAULT", [G0.uuid]), ("close", [])]
    assert read_record(record)[-1]["event"] == "exit"
    assert not where.ready_marker.exists() and not applied_path(where.base).exists()
    assert not (where.base / LIMITS_FILE).exists()
    status = read_status(where.status_file)
    assert status is not None and status.state == "stopped"
    assert orders_dir(mps_root, DRIVER).is_dir()  # the DRA plugin's folder stays

    carry_out(ordered, mps_root, order(1, G0))  # ordered again: a new daemon, NVML opened again
    assert wait_for(where.ready_marker.exists)
    assert len(starts(record)) == 2 and len(modes.made) == 2


@pytest.mark.slow
def test_new_gpus_under_a_name_restart_its_daemon(ordered: OrderedDaemons, mps_root: Path, record: Path,
                                                  modes: Modes) -> None:
    first = order(1, G0, name="gpus-0123456789ab")
    carry_out(ordered, mps_root, first)
    assert wait_for(paths(mps_root, first).ready_marker.exists)
    carry_out(ordered, mps_root, order(2, G1, name="gpus-0123456789ab"))
    assert wait_for(lambda: len(starts(record)) == 2 and ordered.names()[first.name] == starts(record)[1])
    old, new = starts(record)
    assert old != new
    # The old GPU is given back before the new one is taken.
    assert modes.calls[-3:] == [("DEFAULT", [G0.uuid]), ("close", []), ("EXCLUSIVE_PROCESS", [G1.uuid])]
    assert read_applied(paths(mps_root, first).base) == Applied(2)


# --- several daemons, and what is not an order ------------------------------------------------------


@pytest.mark.slow
def test_two_orders_run_side_by_side(ordered: OrderedDaemons, mps_root: Path, record: Path,
                                     modes: Modes) -> None:
    a, b = order(1, G0), order(1, G1)
    write_order(mps_root, a)
    carry_out(ordered, mps_root, b)
    assert wait_for(lambda: all(paths(mps_root, o).ready_marker.exists() for o in (a, b)))
    running = ordered.names()
    assert set(running) == {a.name, b.name} and len(set(running.values())) == 2
    assert len(modes.made) == 1  # one NVML session for all
    assert sorted(modes.calls) == [("EXCLUSIVE_PROCESS", [G0.uuid]), ("EXCLUSIVE_PROCESS", [G1.uuid])]

    remove_order(mps_root, DRIVER, a.name)
    ordered.reconcile()
    assert ordered.names() == {b.name: running[b.name]}
    assert ("close", []) not in modes.calls  # the other daemon still needs it
    assert paths(mps_root, b).ready_marker.exists() and read_applied(paths(mps_root, b).base) == Applied(1)


@pytest.mark.slow
def test_a_daemon_whose_folder_is_blocked_holds_up_no_other(ordered: OrderedDaemons, mps_root: Path,
                                                           record: Path) -> None:
    blocked, fine = order(1, G0), order(1, G1)
    paths(mps_root, blocked).base.parent.mkdir(parents=True)
    paths(mps_root, blocked).base.write_text("someone else's file\n")
    write_order(mps_root, blocked)
    carry_out(ordered, mps_root, fine)
    assert wait_for(paths(mps_root, fine).ready_marker.exists)
    assert read_applied(paths(mps_root, fine).base) == Applied(1)
    assert paths(mps_root, blocked).base.read_text() == "someone else's file\n"


def test_files_that_are_not_orders_are_left_alone(ordered: OrderedDaemons, mps_root: Path,
                                                  modes: Modes) -> None:
    folder = orders_dir(mps_root, DRIVER)
    folder.mkdir(parents=True)
    copied = DaemonOrder(settings(G0), 1)  # an order under another name: copied, not written
    write_order(mps_root, copied)
    (folder / f"{copied.name.rsplit('/', 1)[1]}.json").rename(folder / "GPU-copy.json")
    foreign = {folder / "README.txt": "notes\n", folder / "broken.json": "{not json",
               folder / "GPU-copy.json": (folder / "GPU-copy.json").read_text(),
               mps_root / DRIVER / "other-tool" / "state.json": "{}\n"}
    for path, text in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    ordered.reconcile()
    assert ordered.names() == {} and modes.made == []  # NVML is not even opened
    assert ordered.stop()
    assert {path: path.read_text() for path in foreign} == foreign
    assert sorted(p.name for p in folder.iterdir()) == ["GPU-copy.json", "README.txt", "broken.json"]


def test_nvml_that_cannot_set_compute_modes_ends_the_pass_with_why(mps_root: Path) -> None:
    def refuse() -> FakeModes:
        raise ComputeModeError("cannot initialise NVML to set GPU compute modes: no driver")

    daemons = OrderedDaemons(mps_root, DRIVER, refuse, LOG, PROBE_S, recorder=Recorder())
    write_order(mps_root, order(1, G0))
    with pytest.raises(ModesUnavailable, match="no driver"):
        daemons.reconcile()
    assert daemons.names() == {} and read_applied(paths(mps_root, order(1, G0)).base) is None
    assert daemons.stop()


@pytest.mark.slow
def test_the_final_stop_leaves_the_orders_and_a_new_process_starts_them(
        ordered: OrderedDaemons, mps_root: Path, record: Path, modes: Modes) -> None:
    first = order(3, G0)
    carry_out(ordered, mps_root, first)
    where = paths(mps_root, first)
    assert wait_for(where.ready_marker.exists)
    assert ordered.stop()
    assert ordered.names() == {} and modes.calls[-2:] == [("DEFAULT", [G0.uuid]), ("close", [])]
    assert not where.pipe_dir.exists() and not where.ready_marker.exists()  # host state cleaned up
    assert (orders_dir(mps_root, DRIVER) / f"{G0.uuid}.json").exists()
    ordered.reconcile()  # stopped for good
    assert len(starts(record)) == 1

    again = OrderedDaemons(mps_root, DRIVER, modes, LOG, PROBE_S, recorder=Recorder())
    try:
        again.reconcile()  # after a restart of the MPS pod: the orders found are started
        assert wait_for(where.ready_marker.exists)
        assert len(starts(record)) == 2 and read_applied(where.base) == Applied(3)
    finally:
        assert again.stop()
