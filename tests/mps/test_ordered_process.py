"""`mps-control-daemon --dra-driver`: the process that carries out the DRA plugin's orders, on the stand-in
nvidia-cuda-mps-control and the stand-in NVML (whose compute modes it sets and restores), and how it
refuses to start where it cannot work."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import pytest

from nvdp.daemon.skeleton import Skeleton
from nvdp.inventory.model import Gpu
from nvdp.mps.main import PROG, main
from nvdp.mps.ordered.orders import Applied, orders_dir, read_applied, remove_order, write_order
from nvdp.mps.ordered.work import OrderedDaemonsWork
from sim.mps import read_record, recorded_commands

from .processes import MpsNode, Proc
from .test_ordered_daemons import DRIVER, G0, LOG, PROBE_S, Modes, order, paths, starts
from .waiting import wait_for


def test_an_unusable_mps_root_ends_the_start_with_the_fix(mps_root: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    modes = Modes()
    root = mps_root / "mps"
    root.write_text("not a directory\n")
    skeleton = Skeleton(PROG, LOG, {}, guard=False)
    work = OrderedDaemonsWork(skeleton, root, DRIVER, PROBE_S, modes)
    with caplog.at_level(logging.ERROR, LOG.name):
        assert skeleton.run(work) == 1
    assert (f"cannot start: the MPS root {root} is unusable: {root} is a file, not a directory; fix: "
            in caplog.text), caplog.text
    assert modes.made == [] and root.read_text() == "not a directory\n"


@pytest.mark.parametrize("name", ["", "..", "gpu.nvidia.com/x"])
def test_a_dra_driver_that_is_not_one_folder_is_refused(name: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--dra-driver", name])
    assert exited.value.code == 2
    assert "is not a DRA driver name" in capsys.readouterr().err


T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"  # the stand-in NVML's t4 profile


@pytest.mark.slow
def test_the_dra_driver_process_carries_out_orders_and_stops_on_sigterm(mps_root: Path) -> None:
    node = MpsNode(mps_root)
    proc = Proc("daemon", [sys.executable, "-m", "nvdp.mps.main", "--dra-driver", DRIVER],
                {**node.env, "MPS_PROBE_INTERVAL": str(PROBE_S)}, node.root / "ordered.log")
    node.procs.append(proc)
    try:
        assert proc.wait_output("carrying out the MPS daemon orders"), proc.output()
        t4 = Gpu(index=0, uuid=T4, name="Tesla T4", memory_bytes=G0.memory_bytes, compute_capability=(7, 5),
                 minor=0, pci_bus_id=G0.pci_bus_id)
        first = order(1, t4)
        where = paths(node.mps_root, first)
        write_order(node.mps_root, first)
        assert wait_for(where.ready_marker.exists), proc.output()
        pid = where.ready_marker.read_text().strip()
        assert node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"
        assert read_applied(where.base) == Applied(1)

        write_order(node.mps_root, order(2, t4, threads=50))
        assert wait_for(lambda: read_applied(where.base) == Applied(2)), proc.output()
        assert "set_default_active_thread_percentage 50" in recorded_commands(node.record)
        assert where.ready_marker.read_text().strip() == pid and starts(node.record) == [int(pid)]

        remove_order(node.mps_root, DRIVER, first.name)
        assert wait_for(lambda: node.node.compute_mode(T4) == "DEFAULT"), proc.output()
        assert wait_for(lambda: read_record(node.record)[-1]["event"] == "exit"), proc.output()
        assert not where.ready_marker.exists()

        write_order(node.mps_root, order(1, t4))  # running when SIGTERM comes
        assert wait_for(where.ready_marker.exists), proc.output()
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0, proc.output()
        assert node.node.compute_mode(T4) == "DEFAULT"
        assert (orders_dir(node.mps_root, DRIVER) / f"{T4}.json").exists()  # the DRA plugin's to withdraw
        assert "Traceback" not in proc.output()
    finally:
        node.stop()


@pytest.mark.slow
def test_a_new_pod_waits_while_claims_use_the_daemon_then_takes_over_the_same_state(mps_root: Path) -> None:
    """mps.upgrade whenIdle: the new pod of a surge starts beside the old one (nvdp.mps.node.handover)."""
    node = MpsNode(mps_root)
    env = {**node.env, "MPS_PROBE_INTERVAL": str(PROBE_S)}
    argv = [sys.executable, "-m", "nvdp.mps.main", "--dra-driver", DRIVER]
    old = Proc("old", argv, {**env, "POD_NAME": "dra-mps-old",
                             "MPS_READY_FILE": str(node.root / "old.ready")}, node.root / "old.log")
    node.procs.append(old)
    try:
        t4 = Gpu(index=0, uuid=T4, name="Tesla T4", memory_bytes=G0.memory_bytes, compute_capability=(7, 5),
                 minor=0, pci_bus_id=G0.pci_bus_id)
        first = order(1, t4)
        where = paths(node.mps_root, first)
        write_order(node.mps_root, first)
        assert wait_for(where.ready_marker.exists), old.output()
        pid = where.ready_marker.read_text().strip()
        assert (node.root / "old.ready").exists()

        new = Proc("new", argv, {**env, "POD_NAME": "dra-mps-new",
                                 "MPS_READY_FILE": str(node.root / "new.ready")}, node.root / "new.log")
        node.procs.append(new)
        assert new.wait_output("has waited since"), new.output()
        assert "claim claim-1" in new.output() and "dra-mps-new" in new.output()
        assert not (node.root / "new.ready").exists()
        write_order(node.mps_root, order(2, t4, threads=50))  # the old pod still carries out orders
        assert wait_for(lambda: read_applied(where.base) == Applied(2)), old.output()
        assert where.ready_marker.read_text().strip() == pid and starts(node.record) == [int(pid)]

        remove_order(node.mps_root, DRIVER, first.name)  # the claim's pod ended: the node is idle
        assert wait_for((node.root / "new.ready").exists), new.output()
        write_order(node.mps_root, order(3, t4))  # a claim while the old pod is being retired
        old.signal(signal.SIGTERM)  # what the DaemonSet controller does once the new pod is Ready
        assert old.wait() == 0, old.output()
        assert "a new MPS daemon pod waits to take over" in old.output()
        assert new.wait_output("taking over"), new.output()
        assert wait_for(lambda: read_applied(where.base) == Applied(3)), new.output()
        assert wait_for(where.ready_marker.exists), new.output()
        assert where.ready_marker.read_text().strip() != pid  # the new pod's daemon
        assert node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"
        new.signal(signal.SIGTERM)
        assert new.wait() == 0, new.output()
        assert node.node.compute_mode(T4) == "DEFAULT"
        assert "Traceback" not in old.output() + new.output()
    finally:
        node.stop()
