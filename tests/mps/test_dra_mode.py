"""The MPS control daemon in DRA mode (nvdp.daemon.pernode.mode): no daemons, whatever the entry shares with
MPS (the
DRA plugin runs MPS for its claims); a label switch out of DRA mode starts them, one into DRA mode
waits while a pod uses the GPUs and then stops them."""

from __future__ import annotations

import json
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


def test_no_daemons_in_dra_mode_and_a_switch_waits_for_gpu_pods(node: MpsNode, kube_api: ControlPlane
                                                                 ) -> None:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(name, labels={LABEL: "mps-dra"})
    entries = node.root / "entries"
    entries.mkdir()
    (entries / "mps-dp").write_text(SEED_CONFIG.format(replicas=10) + "flags:\n  mode: device-plugin\n")
    (entries / "mps-dra").write_text(SEED_CONFIG.format(replicas=10) + "flags:\n  mode: dra\n")
    env = {**node.env, "CONFIG_DIR": str(entries), "NODE_NAME": name,
           "KUBECONFIG": str(kube_api.admin_kubeconfig), "DRA_DRIVER_NAME": "gpu.nvidia.com",
           "NVDP_DEFAULT_MODE": "dra"}
    daemon = Proc("daemon", [sys.executable, "-m", "nvdp.mps.main"], env, node.root / "daemon.log")
    node.procs.append(daemon)
    assert daemon.wait_output("DRA mode: the DRA plugin runs MPS for its claims"), daemon.output()
    assert daemon.wait_output("no resource is shared with MPS"), daemon.output()
    assert starts(node) == 0

    kube_api.kubectl("label", "node", name, f"{LABEL}=mps-dp", "--overwrite")
    assert wait_for(lambda: starts(node) == 1, limit_s=20), daemon.output()
    assert wait_for(lambda: node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"), daemon.output()

    # A pod on the GPU: back to DRA mode waits, the daemon keeps running, the refusal is only logged.
    namespace = f"work-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "namespace", namespace)
    kube_api.kubectl("-n", namespace, "create", "serviceaccount", "default")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mps-client", "namespace": namespace},
           "spec": {"nodeName": name, "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": "cuda",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    kube_api.kubectl("create", "-f", "-", input_text=json.dumps(pod))
    kube_api.kubectl("label", "node", name, f"{LABEL}=mps-dra", "--overwrite")
    assert daemon.wait_output(f"{namespace}/mps-client (nvidia.com/gpu)"), daemon.output()
    assert "ModeSwitchRefused" in daemon.output()
    assert node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS" and starts(node) == 1

    kube_api.kubectl("-n", namespace, "delete", "pod", "mps-client", "--grace-period=0", "--force")
    assert wait_for(lambda: node.node.compute_mode(T4) == "DEFAULT", limit_s=30), daemon.output()
    assert daemon.output().count("DRA mode: the DRA plugin runs MPS for its claims") >= 2
    assert daemon.running()
