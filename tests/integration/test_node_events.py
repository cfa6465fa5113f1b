"""Node Events from the running plugin process, recorded in a throwaway kube-apiserver."""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sim.kubelet import KubeletSim
from tests.kube.envtest import ControlPlane

from .conftest import MakePlugin

pytestmark = pytest.mark.slow

# What the chart grants the plugin for Events (templates/rbac-events.yaml).
EVENTS_RBAC = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nvdp-test-events}
rules:
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nvdp-test-events}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nvdp-test-events}
subjects:
  - {kind: ServiceAccount, name: plugin, namespace: nvdp-events-test}
"""


def node_events(api: ControlPlane, node: str) -> list[dict[str, Any]]:
    out = api.kubectl(
        "get",
        "events",
        "-A",
        "-o",
        "json",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={node}",
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def wait_for_event(api: ControlPlane, node: str, reason: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in node_events(api, node):
            if event["reason"] == reason:
                return event
        time.sleep(0.2)
    raise AssertionError(f"no {reason} event on {node}; saw {[e['reason'] for e in node_events(api, node)]}")


def test_xid_reload_refusal_and_mps_wait_are_events_on_the_node(
    make_plugin: MakePlugin, kubelet: KubeletSim, kube_api: ControlPlane, tmp_path: Path
) -> None:
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name)
    kube_api.apply(EVENTS_RBAC)
    kubeconfig = kube_api.service_account_kubeconfig("nvdp-events-test", "plugin")
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    plugin, node = make_plugin(
        "t4",
        NODE_NAME=node_name,
        KUBECONFIG=str(kubeconfig),
        CONFIG_FILE=str(config),
        MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
    )
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=1, timeout=10)
    assert f"Recording events on node {node_name}" in plugin.log
    uuid_ = node.inventory.gpus[0].uuid
    plugin.wait_for_log("Health checks:")
    node.inject_xid(uuid_, 48)
    unhealthy = wait_for_event(kube_api, node_name, "GPUUnhealthy")
    assert unhealthy["type"] == "Warning"
    assert unhealthy["message"].startswith(f"{uuid_}: XID 48 (double-bit ECC error); it needs a GPU reset")
    assert unhealthy["source"]["component"] == "nvidia-device-plugin"

    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    plugin.signal(signal.SIGHUP)
    refused = wait_for_event(kube_api, node_name, "ConfigRefused")
    assert "flags.migStrategy" in refused["message"] and refused["type"] == "Warning"

    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n"
        "        replicas: 2\n"
    )
    plugin.signal(signal.SIGHUP)
    applied = wait_for_event(kube_api, node_name, "ConfigApplied")
    # Time-slicing on a served resource: the running resource is updated in place.
    assert applied["message"] == f"configuration from {config} applied: updated nvidia.com/gpu"

    described = kube_api.kubectl("describe", "node", node_name).stdout
    for reason in ("GPUUnhealthy", "ConfigRefused", "ConfigApplied"):
        assert reason in described
    assert plugin.stop() == 0


def test_waiting_for_the_mps_daemon_is_an_event_with_the_fix(
    make_plugin: MakePlugin, kube_api: ControlPlane, tmp_path: Path
) -> None:
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name)
    kube_api.apply(EVENTS_RBAC)
    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n"
    )
    kubeconfig = kube_api.service_account_kubeconfig("nvdp-events-test", "plugin")
    plugin, _node = make_plugin(
        "t4",
        NODE_NAME=node_name,
        CONFIG_FILE=str(config),
        KUBECONFIG=str(kubeconfig),
        MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
    )
    plugin.start()
    waiting = wait_for_event(kube_api, node_name, "MPSDaemonNotReady")
    assert waiting["type"] == "Warning"
    assert f"kubectl label node {node_name} nvidia.com/mps.capable=true" in waiting["message"]
    assert "MPSDaemonNotReady" in kube_api.kubectl("describe", "node", node_name).stdout
    assert plugin.stop() == 0


def test_without_api_access_events_are_off_and_the_plugin_serves(
    make_plugin: MakePlugin, kubelet: KubeletSim, tmp_path: Path
) -> None:
    plugin, _node = make_plugin("t4", NODE_NAME="gpu-node-1", KUBECONFIG=str(tmp_path / "none"))
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=1, timeout=10)
    assert "Node events off (no API access): no service account token" in plugin.log
    assert plugin.stop() == 0
