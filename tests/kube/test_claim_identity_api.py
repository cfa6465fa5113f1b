"""Who uses which GPU, read back through a real kube-apiserver: every claim the DRA plugin prepares gets
this driver's `status.devices` entries (KEP-4817, server-side apply through nvdp.dra.serving.claim_status)
with the device's identity: a whole GPU, a static MIG device, a time-sliced share and an MPS share
(a dynamic MIG device: tests/kube/test_claim_transaction_api.py). The API server checks each entry
against the claim's allocation (a shared device's entry names its share), so an entry it took is one
a monitoring agent can join to the allocation.

The data's keys are those dcgm-exporter reads of a device (internal/pkg/transformation/dra.go of
NVIDIA/dcgm-exporter: `type`, `uuid`, `parentUUID`, `profile`).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import ClaimRef
from nvdp.dra.claims.sharing.node import NodeSharing
from nvdp.dra.pool.devices import by_name, dra_devices
from nvdp.dra.serving import claim_status
from nvdp.inventory.profile import load_profile
from nvdp.kube import connect, get_claim
from sim.nvml import resolve_profile
from tests.dra.test_prepare import FakeMps, Specs, no_container_holds_a_claim
from tests.kube.envtest import ControlPlane

pytestmark = pytest.mark.slow

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
LOG = logging.getLogger("test-claim-identity-api")
STATIC_MIG = "gpu-2-mig-3g40gb-9-4"
MIXED = by_name(dra_devices(load_profile(resolve_profile("mixed-4"))))
DEVICES = {
    "gpu-0": MIXED["gpu-0"],  # a T4, whole
    "gpu-1": replace(MIXED["gpu-1"], replicas=4, sharing="time-slicing"),  # a T4 in four shares
    "gpu-2": MIXED["gpu-2"],  # a V100, shared through MPS by its claim's config
    STATIC_MIG: by_name(dra_devices(load_profile(resolve_profile("h100-mig-8"))))[STATIC_MIG],
}
MPS_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}}}


def claim_manifest(namespace: str, name: str, config: dict[str, Any] | None = None) -> str:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
    if config is not None:
        devices["config"] = [{"opaque": {"driver": DRIVER, "parameters": config}}]
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}})


def allocated(plane: ControlPlane, namespace: str, name: str, device: str, share_id: str = "",
              config: dict[str, Any] | None = None) -> ClaimRef:
    """A claim allocated `device` of this node's pool (as the scheduler writes it), reserved for a pod."""
    uid = plane.kubectl("create", "-o", "jsonpath={.metadata.uid}", "-f", "-",
                        input_text=claim_manifest(namespace, name, config)).stdout.strip()
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if share_id:
        result["shareID"] = share_id
    status = {"status": {"allocation": {"devices": {"results": [result]}},
                         "reservedFor": [{"resource": "pods", "name": f"pod-{name}",
                                          "uid": str(uuid.uuid4())}]}}
    plane.kubectl("patch", "resourceclaim", "-n", namespace, name, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    return ClaimRef(namespace=namespace, uid=uid, name=name)


def test_every_kind_of_prepared_claim_has_its_devices_identity_in_its_status(kube_api: ControlPlane,
                                                                          tmp_path: Path) -> None:
    namespace = f"identity-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "namespace", namespace)
    client = connect(kube_api.admin_kubeconfig)
    share_a, share_b = str(uuid.uuid4()), str(uuid.uuid4())
    refs = {
        "whole": allocated(kube_api, namespace, "whole", "gpu-0"),
        "mig": allocated(kube_api, namespace, "mig", STATIC_MIG),
        "sliced-a": allocated(kube_api, namespace, "sliced-a", "gpu-1", share_a),
        "sliced-b": allocated(kube_api, namespace, "sliced-b", "gpu-1", share_b),
        "mps": allocated(kube_api, namespace, "mps", "gpu-2", config=MPS_CONFIG),
    }
    sharing = NodeSharing(driver=DRIVER, mps=FakeMps(), log=LOG, no_mps_reason="",  # type: ignore[arg-type]
                          timeslice=lambda gpu, interval: None)
    preparer = ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                             lock_path=str(tmp_path / "pu.lock"), specs=Specs(),
                             get_claim=lambda ns, name: get_claim(client, ns, name),
                             view=lambda: NodeView(DEVICES), log=LOG, sharing=sharing,
                             in_use=no_container_holds_a_claim, status=claim_status(client, DRIVER))
    answers = preparer.prepare(list(refs.values()))
    assert {name: answers[r.uid].error for name, r in refs.items()} == dict.fromkeys(refs, "")
    assert not any(e.status_pending for e in preparer.prepared().values()), "every write taken"

    def entries(name: str) -> list[dict[str, Any]]:
        found = get_claim(client, namespace, name)
        assert found is not None
        return [{k: v for k, v in e.items() if v is not None}  # the API server's "conditions": null
                for e in (found.get("status") or {}).get("devices") or [] if e["driver"] == DRIVER]

    t4, v100, mig = DEVICES["gpu-0"], DEVICES["gpu-2"], DEVICES[STATIC_MIG]
    assert entries("whole") == [{"driver": DRIVER, "pool": NODE, "device": "gpu-0",
                                 "data": {"type": "gpu", "uuid": t4.uuid}}]
    assert entries("mig") == [{"driver": DRIVER, "pool": NODE, "device": STATIC_MIG, "data": {
        "type": "mig", "uuid": mig.uuid, "parentUUID": mig.gpu_uuid, "profile": "3g.40gb"}}]
    for name, share in (("sliced-a", share_a), ("sliced-b", share_b)):
        assert entries(name) == [{"driver": DRIVER, "pool": NODE, "device": "gpu-1", "shareID": share,
                                  "data": {"type": "gpu", "uuid": DEVICES["gpu-1"].uuid,
                                           "sharing": {"strategy": "TimeSlicing"}}}]
    assert entries("mps") == [{"driver": DRIVER, "pool": NODE, "device": "gpu-2", "data": {
        "type": "gpu", "uuid": v100.uuid,
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50, "pinnedMemoryLimitMiB": 4096}}}}]

    # Prepared again (the kubelet retries, or a new pod on the same claim): the entry stays one.
    assert preparer.prepare([refs["whole"]])[refs["whole"].uid].error == ""
    assert len(entries("whole")) == 1
