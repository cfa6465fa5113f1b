"""A claim's device status (KEP-4817) written by server-side apply against a real kube-apiserver: the
driver's entries are set and removed, another driver's are left alone."""

from __future__ import annotations

import json
import uuid

import pytest

from nvdp.kube import apply_device_status, connect, get_claim
from tests.kube.envtest import ControlPlane

pytestmark = pytest.mark.slow
DRIVER = "gpu.nvidia.com"
OTHER = "net.example.com"


def claim_text(name: str) -> str:
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}}})


def test_the_drivers_entries_are_applied_and_removed_leaving_others(kube_api: ControlPlane) -> None:
    name = f"status-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "-f", "-", input_text=claim_text(name))
    allocation = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-3g40gb-9-0"},
        {"request": "nic", "driver": OTHER, "pool": "node-a", "device": "eth0"}]}},
        "devices": [{"driver": OTHER, "pool": "node-a", "device": "eth0", "data": {"mac": "aa:bb"}}]}}
    kube_api.kubectl("patch", "resourceclaim", "-n", "default", name, "--subresource=status",
                     "--type=merge", "-p", json.dumps(allocation))
    client = connect(kube_api.admin_kubeconfig)
    mine = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-3g40gb-9-0",
            "data": {"uuid": "MIG-1111", "parentUUID": "GPU-2222", "profile": "3g.40gb"}}
    apply_device_status(client, "default", name, driver=DRIVER, devices=[mine])
    found = get_claim(client, "default", name)
    assert found is not None
    entries = {e["driver"]: e for e in found["status"]["devices"]}
    assert entries[DRIVER]["data"] == mine["data"]
    assert entries[OTHER]["data"] == {"mac": "aa:bb"}
    apply_device_status(client, "default", name, driver=DRIVER, devices=[])
    found = get_claim(client, "default", name)
    assert found is not None
    assert [e["driver"] for e in found["status"]["devices"]] == [OTHER]
