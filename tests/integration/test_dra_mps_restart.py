"""The MPS daemons of DRA claims outlive the DRA plugin: SIGKILLed or SIGTERMed with MPS claims prepared,
the plugin comes back to the same daemon process, the claims stay prepared, a new claim joins the
adopted daemon, and the last unprepare stops it and removes its state.

Real processes: the unmodified `nvidia-dra-plugin` against a real kube-apiserver, and `mps-control-daemon
--dra-driver` (the chart's dra-mps DaemonSet) carrying out its orders, both on the stand-in NVML and the
stand-in nvidia-cuda-mps-control; the test plays the kubelet's DRA manager on the plugin's socket.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from nvdp.mps.ordered.orders import orders_dir
from nvdp.mps.paths import ResourcePaths
from sim.mps import BIN_DIR, RECORD_ENV
from sim.nvml import NodeSim
from tests.kube.envtest import ControlPlane

from .cdi_node import make_cdi_node
from .conftest import clean_env
from .test_dra_metrics import call
from .test_node_config_rule import Daemon

pytestmark = pytest.mark.slow
DRIVER = "gpu.nvidia.com"
SHARED_T4 = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
             "      replicas: 10\n")


def mps_claim(plane: ControlPlane, node: str, name: str, threads: int) -> str:
    """A claim allocated one share of the node's T4, asking for MPS with `threads`% of it; its uid."""
    config = {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": threads}}}}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                                  "config": [{"requests": ["gpu"], **config}]}}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    status = {"status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0",
                     "shareID": str(uuid.uuid4())}],
        "config": [{"source": "FromClaim", "requests": ["gpu"], **config}]}}}}
    plane.kubectl("-n", "default", "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    return plane.kubectl("-n", "default", "get", "resourceclaim", name, "-o",
                         "jsonpath={.metadata.uid}").stdout


def prepared(answer: Any, uid: str) -> None:
    assert not answer.claims[uid].error, answer


def wait(what: str, condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def test_the_mps_daemon_outlives_the_dra_plugin_killed_or_stopped(kube_api: ControlPlane, tmp_path: Path,
                                                                   sockets: Path) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node)
    mps_root = sockets / "mps"
    (tmp_path / "config.yaml").write_text(SHARED_T4)
    with NodeSim("t4", tmp_path / "nvml") as sim:
        t4 = sim.inventory.gpus[0].uuid
        cdi = make_cdi_node(tmp_path / "cdi-node", sim.inventory)
        base = {**clean_env(), **sim.env, "PATH": f"{BIN_DIR}:{clean_env()['PATH']}", "PYTHONUNBUFFERED": "1",
                "MPS_ROOT": str(mps_root), "MPS_CONTAINER_ROOT": str(mps_root),
                RECORD_ENV: str(tmp_path / "record.jsonl"), "MPS_PROBE_INTERVAL": "0.5"}
        plugin_env = {**base, **cdi.env, "NODE_NAME": node, "KUBECONFIG": str(kube_api.admin_kubeconfig),
                      "CDI_ROOT": str(cdi.cdi_dir), "CONFIG_FILE": str(tmp_path / "config.yaml"),
                      "KUBELET_PLUGINS_DIR": str(sockets / "plugins"),
                      "KUBELET_REGISTRAR_DIR": str(sockets / "registry"),
                      # no kubelet here to ask which pods hold claims
                      "KUBELET_POD_RESOURCES_SOCKET": str(sockets / "no-kubelet.sock")}
        socket = str(sockets / "plugins" / DRIVER / "dra.sock")
        daemon_dir = ResourcePaths(mps_root, f"{DRIVER}/{t4}")
        pid_file = daemon_dir.pipe_dir / "nvidia-cuda-mps-control.pid"
        runs: list[Daemon] = []

        def plugin() -> Daemon:
            runs.append(Daemon([sys.executable, "-m", "nvdp.dra.main"], plugin_env,
                               tmp_path / f"dra-{len(runs)}.log"))
            runs[-1].wait_for("Registration socket for", timeout=30)
            return runs[-1]

        ordered = Daemon([sys.executable, "-m", "nvdp.mps.main", "--dra-driver", DRIVER], base,
                         tmp_path / "dra-mps.log")
        try:
            first = plugin()
            uid_a = mps_claim(kube_api, node, "mps-a", 25)
            prepared(call(socket, "NodePrepareResources", ("mps-a", uid_a)), uid_a)
            assert daemon_dir.ready_marker.exists()
            pid = pid_file.read_text().strip()
            assert pid, "the MPS control daemon's pid"

            # SIGKILL: nothing of the plugin's shut-down runs; the daemon serves on.
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
            assert pid_file.read_text().strip() == pid and daemon_dir.ready_marker.exists()
            second = plugin()
            second.wait_for("Prepared claims on this node: 1")
            assert pid_file.read_text().strip() == pid, "the restarted plugin adopted the same daemon"
            # A new claim joins the adopted daemon, raising its ceiling in place.
            uid_b = mps_claim(kube_api, node, "mps-b", 50)
            prepared(call(socket, "NodePrepareResources", ("mps-b", uid_b)), uid_b)
            assert pid_file.read_text().strip() == pid
            limits = json.loads((daemon_dir.base / "limits.json").read_text())
            assert limits["ceiling"]["thread_percentage"] == 50
            assert set(limits["claims"]) == {uid_a, uid_b}

            # SIGTERM: the plugin's own shut-down leaves the daemon alone too.
            assert second.stop() == 0, second.log
            assert pid_file.read_text().strip() == pid and daemon_dir.ready_marker.exists()
            third = plugin()
            third.wait_for("Prepared claims on this node: 2")
            assert pid_file.read_text().strip() == pid
            # Both claims' CDI specs are still there, and a repeated prepare is answered from the record.
            prepared(call(socket, "NodePrepareResources", ("mps-a", uid_a), ("mps-b", uid_b)), uid_a)

            # The last unprepare stops the daemon and removes its state.
            prepared(call(socket, "NodeUnprepareResources", ("mps-a", uid_a)), uid_a)
            time.sleep(0.5)
            assert pid_file.read_text().strip() == pid, "claim mps-b still uses it"
            prepared(call(socket, "NodeUnprepareResources", ("mps-b", uid_b)), uid_b)
            wait("the daemon stopped", lambda: not daemon_dir.ready_marker.exists() and not pid_file.exists())
            assert not list(orders_dir(mps_root, DRIVER).iterdir())
            wait("its state removed", lambda: not (daemon_dir.base / "applied.json").exists())
            assert not (daemon_dir.base / "limits.json").exists()
            mode = Path(sim.env["NVML_SIM_STATE_DIR"]) / "compute-mode" / t4
            assert not mode.exists() or mode.read_text().strip() == "DEFAULT"
            assert third.stop() == 0, third.log
        finally:
            for run in runs:
                run.stop()
            code = ordered.stop()
        assert code == 0, ordered.log
        assert "Traceback" not in ordered.log, ordered.log
