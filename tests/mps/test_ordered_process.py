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
