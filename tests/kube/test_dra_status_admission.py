"""The DRA plugin's writes to claims' status against a real kube-apiserver, with the chart's RBAC and
admission policy (admissionpolicy-dra.yaml, rendered with dra.enabled alone): its token, bound to a pod
on one node, may set this driver's status.devices entries of a claim allocated on that node (what every
prepare does, through `apply_device_status`), and nothing else: not a claim allocated on
another node, not another driver's entry, not another pool's, not the allocation or reservedFor.

Two API servers: one as Kubernetes 1.34 and 1.35 are (DRAResourceClaimGranularStatusAuthorization
off: RBAC grants every claim's status and only the policy narrows it, so each refusal must be the
policy's), and one as 1.36 is by default, where the API server also checks the node-aware
resourceclaims/driver verb; there the chart's grants must still let the plugin write its own entry,
and every other write is refused, by either check.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from lightkube.core.exceptions import ApiError

from nvdp.kube import apply_device_status, connect, get_claim
from tests.kube.envtest import ControlPlane, _control_plane

pytestmark = pytest.mark.slow

DRIVER = "gpu.nvidia.com"
OTHER_DRIVER = "net.example.com"
CHART = Path(__file__).resolve().parents[2] / "charts" / "nvidia-device-plugin"
RELEASE = "nvdp"
NAMESPACE = "dra-status"
SA = "nvdp-nvidia-device-plugin-dra-plugin"
CLAIMS = "claims"
POLICY_WAIT_S = 120
# The chart renders the policy with the DRA plugin, whatever its config entries.
VALUES = {"dra": {"enabled": True}}
AS_1_35 = "DRAResourceClaimGranularStatusAuthorization=false"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def chart_objects() -> list[dict[str, Any]]:
    """The DRA plugin's account, its RBAC and the DRA admission policies, as the chart renders them."""
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding"}
    manifests = helm_python.Chart.load(str(CHART)).render(VALUES, name=RELEASE, namespace=NAMESPACE,
                                                          is_install=True)
    objects = [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
               for doc in yaml.safe_load_all(text)
               if doc and doc["kind"] in wanted and "dra-plugin" in doc["metadata"]["name"]]
    policies = [o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert any(name.endswith("-claim-status") for name in policies), policies
    return objects


def pod_token_kubeconfig(plane: ControlPlane, node: str | None) -> Path:
    """The DRA plugin's token bound to a pod on `node` (the API server puts the node into the requests
    made with it, `authentication.kubernetes.io/node-name`); None: a token bound to nothing."""
    if node is None:
        return plane.service_account_kubeconfig(NAMESPACE, SA)
    pod = unique("dra")
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": NAMESPACE},
                "spec": {"nodeName": node, "serviceAccountName": SA, "automountServiceAccountToken": False,
                         "containers": [{"name": "c", "image": "none"}]}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    uid = plane.kubectl("-n", NAMESPACE, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}").stdout
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}", f"--bound-object-uid={uid}"]
    token = plane.kubectl("-n", NAMESPACE, "create", "token", SA, *bound).stdout.strip()
    config = yaml.safe_load(plane.admin_kubeconfig.read_text())
    user = f"system:serviceaccount:{NAMESPACE}:{SA}"
    config["users"] = [{"name": user, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = user
    path = plane.workdir / f"{pod}.kubeconfig"
    path.write_text(json.dumps(config))
    return path


def allocated_claim(plane: ControlPlane, node: str, *, pool: str | None = None,
                    node_selector: bool = True) -> str:
    """A claim allocated as the scheduler allocates it on `node`: a GPU of this driver from `pool` (the
    node's own by default) and a NIC of another driver from the node's pool, whose status entry that
    driver has written; the allocation's node selector names the node (as for node-local devices)."""
    name = unique("claim")
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": CLAIMS},
             "spec": {"devices": {"requests": [
                 {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                 {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    allocation: dict[str, Any] = {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": pool or node, "device": "gpu-0"},
        {"request": "nic", "driver": OTHER_DRIVER, "pool": node, "device": "eth0"}]}}
    if node_selector:
        allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    status = {"status": {"allocation": allocation, "devices": [
        {"driver": OTHER_DRIVER, "pool": node, "device": "eth0", "data": {"mac": "aa:bb"}}]}}
    plane.kubectl("-n", CLAIMS, "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    return name


def mig_entry(pool: str) -> dict[str, Any]:
    """What the dynamic-MIG prepare writes for the MIG device it made."""
    return {"driver": DRIVER, "pool": pool, "device": "gpu-0",
            "data": {"uuid": "MIG-1111", "parentUUID": "GPU-2222", "profile": "3g.40gb"}}


def entries(plane: ControlPlane, name: str) -> dict[str, dict[str, Any]]:
    found = get_claim(connect(plane.admin_kubeconfig), CLAIMS, name)
    assert found is not None
    return {e["driver"]: e for e in (found.get("status") or {}).get("devices") or []}


def status_patch(client: Any, name: str, status: dict[str, Any]) -> None:
    """A merge patch of a claim's status, as any client of the account could send."""
    from lightkube.core.generic_client import BasicRequest

    generic = client._client
    request = BasicRequest(
        method="PATCH", url=f"apis/resource.k8s.io/v1/namespaces/{CLAIMS}/resourceclaims/{name}/status",
        params={}, data={"status": status}, headers={"Content-Type": "application/merge-patch+json"})
    response = generic.send(generic.build_adapter_request(request))
    generic.raise_for_status(response)  # type: ignore[no-untyped-call]


def refused(call: Callable[[], object], *, granular: bool = False) -> str:
    """Refused: 403 from admission; with `granular`, also 1.36's own check of the node-aware verbs,
    which answers 422 with a Forbidden cause ("... cannot arbitrary-node:patch resource ...")."""
    with pytest.raises(ApiError) as err:
        call()
    status = err.value.status
    message = str(status.message)
    if granular and status.code == 422:
        assert "Forbidden" in message and "resourceclaims/" in message, status
    else:
        assert status.code == 403, status
    return message


def policy_refused(call: Callable[[], object]) -> str:
    """Refused by the chart's claim-status policy (not by RBAC or the API server's own checks)."""
    message = refused(call)
    assert "-claim-status' with binding" in message, message
    return message


class Plane:
    """An API server with the chart's DRA objects applied; `granular`: 1.36's own status checks on."""

    def __init__(self, plane: ControlPlane, granular: bool) -> None:
        self.plane = plane
        self.granular = granular

    def refused_by_policy(self, call: Callable[[], object]) -> str:
        """Refused; by the policy where nothing else checks (as 1.34 and 1.35), "" on 1.36."""
        if self.granular:
            refused(call, granular=True)
            return ""
        return policy_refused(call)


def setup(plane: ControlPlane) -> None:
    for namespace in (NAMESPACE, CLAIMS):
        if plane.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            plane.kubectl("create", "namespace", namespace)
    plane.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": chart_objects()}))
    wait_for_policy(plane)


def wait_for_policy(plane: ControlPlane) -> None:
    """A new policy takes a moment to be enforced: probe until an entry of another pool is refused by
    it (a write only the policy refuses, whatever the version: the claim is on the token's node)."""
    node, foreign = unique("probe"), unique("pool")
    plane.create_node(node)
    name = allocated_claim(plane, node, pool=foreign)
    client = connect(pod_token_kubeconfig(plane, node))
    deadline = time.monotonic() + POLICY_WAIT_S
    last = "allowed"
    try:
        while time.monotonic() < deadline:
            try:
                apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[mig_entry(foreign)])
                apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[])
            except ApiError as err:
                last = f"{err.status.code} {err.status.message}"
                if err.status.code == 403 and "its own pool" in (err.status.message or ""):
                    return
            time.sleep(0.5)
    finally:
        client.close()
    raise AssertionError(f"the claim-status policy was not enforced within {POLICY_WAIT_S} s: {last}")


@pytest.fixture(scope="module", params=["as 1.34 and 1.35", "as 1.36"])
def plane(request: pytest.FixtureRequest, kube_api: ControlPlane) -> Iterator[Plane]:
    if request.param == "as 1.36":
        setup(kube_api)
        yield Plane(kube_api, granular=True)
        return
    for own in _control_plane("nvdp-kube-status-", feature_gates=AS_1_35):
        setup(own)
        yield Plane(own, granular=False)


def test_the_plugin_writes_and_removes_its_entry_on_a_claim_of_its_node(plane: Plane) -> None:
    node = unique("node-a")
    plane.plane.create_node(node)
    name = allocated_claim(plane.plane, node)
    client = connect(pod_token_kubeconfig(plane.plane, node))
    apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[mig_entry(node)])
    found = entries(plane.plane, name)
    assert found[DRIVER]["data"]["uuid"] == "MIG-1111"
    assert found[OTHER_DRIVER]["data"] == {"mac": "aa:bb"}  # left as it was
    # A remade MIG device: the entry changes.
    apply_device_status(client, CLAIMS, name, driver=DRIVER,
                        devices=[{**mig_entry(node), "data": {"uuid": "MIG-3333"}}])
    assert entries(plane.plane, name)[DRIVER]["data"] == {"uuid": "MIG-3333"}
    apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[])
    assert set(entries(plane.plane, name)) == {OTHER_DRIVER}


def test_a_claim_allocated_on_another_node_is_refused(plane: Plane) -> None:
    mine, other = unique("node-a"), unique("node-b")
    plane.plane.create_node(mine)
    plane.plane.create_node(other)
    theirs = allocated_claim(plane.plane, other)
    client = connect(pod_token_kubeconfig(plane.plane, mine))
    message = plane.refused_by_policy(
        lambda: apply_device_status(client, CLAIMS, theirs, driver=DRIVER, devices=[mig_entry(other)]))
    if message:
        assert (f"the DRA plugin on node {mine} may only write the status of claims allocated on its own "
                f"node, not of {CLAIMS}/{theirs}") in message
    # Not even a write that changes nothing. (An entry naming a device the claim was not allocated, such
    # as one of its own pool, the API server refuses as invalid whoever writes it.)
    plane.refused_by_policy(lambda: apply_device_status(client, CLAIMS, theirs, driver=DRIVER, devices=[]))
    assert set(entries(plane.plane, theirs)) == {OTHER_DRIVER}
    # The node selector decides, whatever the pool says: a claim pinned to node-b with a device from
    # node-a's pool is still node-b's.
    pinned = allocated_claim(plane.plane, other, pool=mine)
    plane.refused_by_policy(
        lambda: apply_device_status(client, CLAIMS, pinned, driver=DRIVER, devices=[mig_entry(mine)]))


def test_without_a_node_selector_the_pool_says_where_a_claim_is(plane: Plane) -> None:
    mine, other = unique("node-a"), unique("node-b")
    plane.plane.create_node(mine)
    plane.plane.create_node(other)
    client = connect(pod_token_kubeconfig(plane.plane, mine))
    here = allocated_claim(plane.plane, mine, node_selector=False)
    there = allocated_claim(plane.plane, other, node_selector=False)
    if not plane.granular:  # 1.36 judges such a claim itself
        apply_device_status(client, CLAIMS, here, driver=DRIVER, devices=[mig_entry(mine)])
        assert entries(plane.plane, here)[DRIVER]["pool"] == mine
    plane.refused_by_policy(
        lambda: apply_device_status(client, CLAIMS, there, driver=DRIVER, devices=[mig_entry(other)]))


def test_another_drivers_entry_is_refused(plane: Plane) -> None:
    node = unique("node-a")
    plane.plane.create_node(node)
    name = allocated_claim(plane.plane, node)
    client = connect(pod_token_kubeconfig(plane.plane, node))
    nic = {"driver": OTHER_DRIVER, "pool": node, "device": "eth0", "data": {"mac": "66:66"}}
    # Changed through a server-side apply under the other driver's field manager ...
    message = plane.refused_by_policy(
        lambda: apply_device_status(client, CLAIMS, name, driver=OTHER_DRIVER, devices=[nic]))
    if message:
        assert ("may only change the status.devices entries of driver gpu.nvidia.com, not of "
                f"{OTHER_DRIVER}") in message
    # ... its own entry and the other's in one apply, or the other's removed by a merge patch.
    plane.refused_by_policy(
        lambda: apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[mig_entry(node), nic]))
    plane.refused_by_policy(lambda: status_patch(client, name, {"devices": []}))
    found = entries(plane.plane, name)
    assert set(found) == {OTHER_DRIVER} and found[OTHER_DRIVER]["data"] == {"mac": "aa:bb"}


def test_another_pools_entry_is_refused(plane: Plane) -> None:
    node, pool = unique("node-a"), unique("pool")
    plane.plane.create_node(node)
    name = allocated_claim(plane.plane, node, pool=pool)
    client = connect(pod_token_kubeconfig(plane.plane, node))
    message = policy_refused(  # the policy's on every version: the claim is on the token's node
        lambda: apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[mig_entry(pool)]))
    assert (f"on node {node} may only change the status.devices entries of its own pool, not of pool "
            f"{pool}") in message


def test_allocation_and_reservations_are_refused(plane: Plane) -> None:
    node = unique("node-a")
    plane.plane.create_node(node)
    name = allocated_claim(plane.plane, node)
    client = connect(pod_token_kubeconfig(plane.plane, node))
    pod = {"resource": "pods", "name": "intruder", "uid": str(uuid.uuid4())}
    message = plane.refused_by_policy(lambda: status_patch(client, name, {"reservedFor": [pod]}))
    if message:
        assert "may only change status.devices of a claim, not status.reservedFor" in message
    # Taking the allocation away (the claim could then be allocated again: a device handed out twice).
    message = plane.refused_by_policy(
        lambda: status_patch(client, name, {"allocation": None, "devices": None}))
    if message:
        assert "not status.allocation" in message
    found = get_claim(connect(plane.plane.admin_kubeconfig), CLAIMS, name)
    assert found is not None
    assert "reservedFor" not in found["status"] and found["status"]["allocation"]["devices"]["results"]


def test_a_token_without_the_node_claim_is_refused(plane: Plane) -> None:
    node = unique("node-a")
    plane.plane.create_node(node)
    name = allocated_claim(plane.plane, node)
    client = connect(pod_token_kubeconfig(plane.plane, None))
    message = plane.refused_by_policy(
        lambda: apply_device_status(client, CLAIMS, name, driver=DRIVER, devices=[mig_entry(node)]))
    if message:
        assert "token is not bound to a node" in message
