"""`nvdp doctor` shows the MPS limits that are enforced and those that are advisory: in device-plugin
mode each resource's ceiling, in DRA mode each daemon's ceiling and every claim's own limits."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest

from nvdp.config.model import Config
from nvdp.daemon.report.recording import Recorder
from nvdp.doctor.mps_check import DRA_TITLE, MpsChecks
from nvdp.doctor.where import Where
from nvdp.dra.claims.sharing.mps import ClaimMps
from nvdp.dra.claims.sharing.mps_limits import LIMITS_FILE, ClaimLimits
from nvdp.inventory.model import Inventory
from nvdp.mps.daemons import plan_mps
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.supervisor import Backoff, ResourceDaemon
from nvdp.plan import Plan, plan

from .fakes import FakeModes
from .nodes import gpu, inventory, mps_config
from .ordered_runner import carried_out
from .waiting import wait_for

LOG = logging.getLogger("test.mps.doctor")
G0 = gpu(0).uuid


class Checks(MpsChecks):
    def __init__(self, env: dict[str, str], config: Config, node: Inventory) -> None:
        self.where = Where(env=env, context="host")
        self.config = config
        self.inventory = node
        self.plan: Plan | None = plan(config, node)


@pytest.mark.slow
def test_device_plugin_mode_shows_the_replica_ceiling_as_enforced(mps_root: Path, record: Path) -> None:
    node = inventory(gpu(0))
    (settings,) = plan_mps(mps_config(10), node)
    daemon = ResourceDaemon(settings, ResourcePaths(mps_root, "nvidia.com/gpu"), FakeModes(), LOG,
                            probe_interval_s=0.05, backoff=Backoff(0.05, 0.2), recorder=Recorder())
    daemon.start()
    try:
        assert wait_for(daemon.paths.ready_marker.exists)
        # The kubelet folders point into the test's own root: a DRA plugin registered on this machine
        # (the end-to-end suite's) must not make this node look like a DRA node.
        env = {"MPS_CONTAINER_ROOT": str(mps_root), "KUBELET_REGISTRAR_DIR": str(mps_root / "registry"),
               "KUBELET_PLUGINS_DIR": str(mps_root / "plugins")}
        (finding,) = Checks(env, mps_config(10), node).mps()
    finally:
        daemon.stop()
    assert finding.status == "PASS", finding
    assert finding.detail.endswith("; enforced for every client (each gets the same share): 10% threads, "
                                   "1536 MiB on GPU 0")


@pytest.mark.slow
def test_dra_mode_shows_each_daemons_ceiling_and_which_claim_limits_are_advisory(mps_root: Path,
                                                                                 record: Path) -> None:
    node = inventory(gpu(0), gpu(1))
    claims = ClaimMps(root=mps_root, host_root="/run/nvidia/mps", driver="gpu.nvidia.com", inventory=node,
                      log=LOG, ready_wait_s=10, poll_s=0.01)
    env = {"MPS_CONTAINER_ROOT": str(mps_root), "DRA_DRIVER_NAME": "gpu.nvidia.com"}
    with carried_out(mps_root, FakeModes):
        claims.use("uid-small", [G0], ClaimLimits(thread_percentage=25, memory_mib=((G0, 3840),)))
        (same,) = Checks(env, Config(source="test"), node).mps()
        assert same.status == "PASS" and same.title == f"{DRA_TITLE} {G0}"
        assert same.detail == (f"enforced ceiling (every client of its MPS server): 25% threads, 3840 MiB on "
                               f"{G0}; claim uid-small: 25% threads, 3840 MiB on {G0}, enforced")
        claims.use("uid-large", [G0], ClaimLimits(thread_percentage=50, memory_mib=((G0, 7680),)))
        (mixed,) = Checks(env, Config(source="test"), node).mps()
    assert mixed.detail == (
        f"enforced ceiling (every client of its MPS server): 50% threads, 7680 MiB on {G0}; "
        f"claim uid-large: 50% threads, 7680 MiB on {G0}, enforced; "
        f"claim uid-small: 25% threads, 3840 MiB on {G0}, advisory (its environment only): "
        f"25% threads (enforced: 50%); 3840 MiB on {G0} (enforced: 7680 MiB)")


def test_dra_mode_without_mps_claims_and_an_unreadable_limits_file(tmp_path: Path) -> None:
    env = {"MPS_CONTAINER_ROOT": str(tmp_path), "DRA_DRIVER_NAME": "gpu.nvidia.com"}
    # The node's config shares with MPS, but in DRA mode no MPS control-daemon DaemonSet runs: no FAIL.
    (none,) = Checks(env, mps_config(4), inventory(gpu(0))).mps()
    assert none.status == "PASS" and "none on this node uses MPS" in none.detail
    broken = tmp_path / "gpu.nvidia.com" / G0 / LIMITS_FILE
    broken.parent.mkdir(parents=True)
    broken.write_text("{")
    (bad,) = Checks(env, Config(source="test"), inventory(gpu(0))).mps()
    assert bad.status == "FAIL" and "cannot be read as the daemon's limits" in bad.detail


def test_dra_mode_a_failing_daemon_fails_with_its_error_and_its_limits(tmp_path: Path) -> None:
    from nvdp.dra.claims.sharing.mps_limits import write_limits
    from nvdp.mps.commands import Ceiling
    from nvdp.mps.status import write_status

    env = {"MPS_CONTAINER_ROOT": str(tmp_path), "DRA_DRIVER_NAME": "gpu.nvidia.com"}
    base = tmp_path / "gpu.nvidia.com" / G0
    base.mkdir(parents=True)
    write_limits(base / LIMITS_FILE, (G0,), Ceiling(25, (3840,)), {"u1": ClaimLimits(thread_percentage=25)})
    write_status(base / "status.json", "failing", "nvidia-cuda-mps-control exited with status 1")
    (finding,) = Checks(env, Config(source="test"), inventory(gpu(0))).mps()
    assert finding.status == "FAIL"
    assert finding.detail.startswith("the daemon is failing: nvidia-cuda-mps-control exited with status 1; "
                                     "enforced ceiling (every client of its MPS server): 25% threads")
    assert str(base / "log" / "control.log") in finding.fix


def test_a_waiting_upgrade_of_the_mps_daemon_names_its_pods_in_either_mode(tmp_path: Path) -> None:
    from nvdp.mps.node.handover import Handover, Users

    node = inventory(gpu(0))
    env = {"MPS_CONTAINER_ROOT": str(tmp_path), "KUBELET_REGISTRAR_DIR": str(tmp_path / "registry"),
           "KUBELET_PLUGINS_DIR": str(tmp_path / "plugins"), "NODE_NAME": "node-a"}
    for base, users in ((tmp_path, ("ml/train-0",)), (tmp_path / "gpu.nvidia.com", ("claim 1234",))):
        holder = Handover(base, "old", Users, LOG, None)
        successor = Handover(base, "mps-new", functools.partial(Users, names=users), LOG, None)
        try:
            assert holder.take() and not successor.take()
            waiting = [f for f in Checks(env, mps_config(10), node).mps()
                       if f.title == "an upgrade of the MPS daemon waits"]
        finally:
            holder.close()
            successor.close()
        (finding,) = waiting
        assert finding.status == "FAIL" and users[0] in finding.detail and "mps-new" in finding.detail
        assert "mps.upgrade=immediately" in finding.fix
    assert not [f for f in Checks(env, mps_config(10), node).mps() if "upgrade" in f.title]
