"""/metrics of a running nvidia-dra-plugin: NVIDIA's nvidia_dra_* series after the kubelet's calls.

The plugin runs unmodified on the stand-in NVML with a real kube-apiserver; the test plays the
kubelet's DRA manager on the plugin's socket with the real request messages, for a claim allocated on
the node (prepared, then unprepared) and one the API server does not have (refused).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from nvdp.daemon.grpc_import import grpc
from nvdp.dra.kubelet.api import dra_v1_pb2
from nvdp.dra.kubelet.server import dra_v1_grpc
from sim.nvml import NodeSim
from tests.kube.envtest import ControlPlane

from .cdi_node import make_cdi_node
from .conftest import clean_env
from .scrape import free_port, scrape, value
from .test_node_config_rule import Daemon

pytestmark = pytest.mark.slow
DRIVER = "gpu.nvidia.com"


def allocated_claim(plane: ControlPlane, node: str, name: str, device: str) -> str:
    """A ResourceClaim the scheduler allocated `device` of `node`'s pool; its uid."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    status = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]}}}}
    plane.kubectl("-n", "default", "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    found = plane.kubectl("-n", "default", "get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}")
    return found.stdout


def call(socket: str, method: str, *claims: tuple[str, str]) -> Any:
    kind = "Prepare" if method == "NodePrepareResources" else "Unprepare"
    message = getattr(dra_v1_pb2, f"Node{kind}ResourcesRequest")(
        claims=[dra_v1_pb2.Claim(namespace="default", name=name, uid=uid) for name, uid in claims])
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        return getattr(dra_v1_grpc.DRAPluginStub(channel), method)(message, timeout=30)


def test_metrics_of_a_running_dra_plugin_count_the_kubelets_calls(kube_api: ControlPlane, tmp_path: Path,
                                                                  sockets: Path) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node)
    port = free_port()
    with NodeSim("t4", tmp_path / "nvml") as sim:
        cdi = make_cdi_node(tmp_path / "cdi-node", sim.inventory)
        env = {**clean_env(), **sim.env, **cdi.env, "NODE_NAME": node, "PYTHONUNBUFFERED": "1",
               "KUBECONFIG": str(kube_api.admin_kubeconfig), "CDI_ROOT": str(cdi.cdi_dir),
               "KUBELET_PLUGINS_DIR": str(sockets / "plugins"),
               "KUBELET_REGISTRAR_DIR": str(sockets / "registry"), "METRICS_ADDRESS": f"127.0.0.1:{port}"}
        daemon = Daemon([sys.executable, "-m", "nvdp.dra.main"], env, tmp_path / "dra.log")
        try:
            daemon.wait_for("Registration socket for")
            samples = scrape(port)
            labels = {"driver": DRIVER}
            assert value(samples, "nvidia_dra_requests_total", operation="prepare", **labels) == 0
            assert value(samples, "nvidia_dra_requests_inflight", operation="prepare", **labels) == 0
            assert value(samples, "nvidia_dra_prepared_devices", node=node, device_type="gpu", **labels) == 0

            socket = str(sockets / "plugins" / DRIVER / "dra.sock")
            uid = allocated_claim(kube_api, node, "metrics-a", "gpu-0")
            answer = call(socket, "NodePrepareResources", ("metrics-a", uid), ("never-made", "uid-none"))
            assert not answer.claims[uid].error, answer
            assert "not in the API server" in answer.claims["uid-none"].error

            samples = scrape(port)
            assert value(samples, "nvidia_dra_requests_total", operation="prepare", **labels) == 1
            assert value(samples, "nvidia_dra_request_duration_seconds_count", operation="prepare",
                         **labels) == 1
            assert value(samples, "nvidia_dra_requests_inflight", operation="prepare", **labels) == 0
            assert value(samples, "nvidia_dra_node_prepare_errors_total", error_type="claim_not_found",
                         **labels) == 1
            assert value(samples, "nvidia_dra_prepared_devices", node=node, device_type="gpu", **labels) == 1
            assert value(samples, "nvidia_dra_prepared_devices", node=node, device_type="mig", **labels) == 0

            answer = call(socket, "NodeUnprepareResources", ("metrics-a", uid))
            assert not answer.claims[uid].error, answer
            samples = scrape(port)
            assert value(samples, "nvidia_dra_requests_total", operation="unprepare", **labels) == 1
            assert value(samples, "nvidia_dra_prepared_devices", node=node, device_type="gpu", **labels) == 0
            error_types = {dict(key)["error_type"] for name, key in samples
                           if name.startswith("nvidia_dra_node_") and name.endswith("_errors_total")}
            assert error_types == {"claim_not_found"}, samples
        finally:
            code = daemon.stop()
    assert code == 0, daemon.log
