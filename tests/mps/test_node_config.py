"""The MPS control daemon follows the per-node config: label a node onto an MPS entry and its daemon
starts; label it away and the daemon stops with the compute mode back to DEFAULT."""

from __future__ import annotations

import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.mps import read_record
from tests.kube.envtest import ControlPlane

from .processes import SEED_CONFIG, MpsNode, Proc
from .waiting import wait_for

pytestmark = pytest.mark.slow
T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
LABEL = "nvidia.com/device-plugin.config"


@pytest.fixture
def node(mps_root: Path) -> Iterator[MpsNode]:
    n = MpsNode(mps_root)
    yield n
    n.stop()


def starts(node: MpsNode) -> int:
    return sum(1 for e in read_record(node.record) if e["event"] == "start")


def test_daemon_starts_and_stops_with_the_node_label(node: MpsNode, kube_api: ControlPlane) -> None:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(name)
    entries = node.root / "entries"
    entries.mkdir()
    (entries / "plain").write_text("version: v1\n")
    (entries / "mps").write_text(SEED_CONFIG.format(replicas=10))
    env = {**node.env, "CONFIG_DIR": str(entries), "DEFAULT_CONFIG": "plain", "NODE_NAME": name,
           "KUBECONFIG": str(kube_api.admin_kubeconfig)}
    daemon = Proc("daemon", [sys.executable, "-m", "nvdp.mps.main"], env, node.root / "daemon.log")
    node.procs.append(daemon)
    assert daemon.wait_output("no resource is shared with MPS"), daemon.output()
    assert starts(node) == 0

    kube_api.kubectl("label", "node", name, f"{LABEL}=mps")
    assert wait_for(lambda: starts(node) == 1, limit_s=20), daemon.output()
    assert wait_for(lambda: node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"), daemon.output()

    # An unknown entry changes nothing: the daemon keeps running.
    kube_api.kubectl("label", "node", name, f"{LABEL}=typo", "--overwrite")
    assert daemon.wait_output("names config 'typo', which does not exist"), daemon.output()
    assert starts(node) == 1 and node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"

    kube_api.kubectl("label", "node", name, f"{LABEL}=plain", "--overwrite")
    assert wait_for(lambda: node.node.compute_mode(T4) == "DEFAULT", limit_s=20), daemon.output()
    assert daemon.wait_output("no resource is shared with MPS", count=2), daemon.output()
    assert [e["event"] for e in read_record(node.record)].count("start") == 1
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
