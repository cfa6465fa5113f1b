"""DRA's API edge against a real kube-apiserver: the slice publisher, claims, and the chart's DRA
RBAC and admission policy (a service-account token bound to a pod on node A may write only node A's
slices)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from lightkube.core.exceptions import ApiError

from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.publish import PublishError, SlicePublisher
from nvdp.kube import (
    connect,
    create_slice,
    delete_slice,
    get_claim,
    list_claims,
    list_slices,
    replace_slice,
)
from tests.kube.envtest import ControlPlane

DRIVER = "gpu.nvidia.com"
CHART = Path(__file__).resolve().parents[2] / "charts" / "nvidia-device-plugin"
LOG = logging.getLogger("test.dra")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def gpu(minor: int, memory: int = 16106127360) -> DraDevice:
    uid = f"GPU-{minor:08d}-0000-0000-0000-000000000000"
    return DraDevice(name=f"gpu-{minor}", kind="gpu", uuid=uid, gpu_uuid=uid,
                     attributes={"type": {"string": "gpu"}, "uuid": {"string": uid},
                                 "driverVersion": {"version": "570.124.6"}},
                     capacity={"memory": {"value": str(memory)}})


def mig(minor: int, index: int) -> DraDevice:
    parent = gpu(minor).uuid
    return DraDevice(name=f"gpu-{minor}-mig-1g10gb-19-{index}", kind="mig", uuid=f"MIG-{minor}-{index}",
                     gpu_uuid=parent,
                     attributes={"type": {"string": "mig"}, "parentUUID": {"string": parent}},
                     capacity={"memory": {"value": "10Gi"}, "memorySlice0": {"value": "1"}})


def slices(plane: ControlPlane, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    return sorted(list_slices(connect(plane.admin_kubeconfig), node=node, driver=driver),
                  key=lambda s: s["metadata"]["name"])


def device_names(plane: ControlPlane, node: str) -> list[str]:
    return sorted(d["name"] for s in slices(plane, node) for d in s["spec"].get("devices", []))


def eventually(check: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout_s} s")
        time.sleep(0.05)


def publisher(plane: ControlPlane, node: str, kubeconfig: Path | None = None) -> SlicePublisher:
    return SlicePublisher(connect(kubeconfig or plane.admin_kubeconfig), node=node, driver=DRIVER, log=LOG)


# -- the publisher ---------------------------------------------------------------------------------
def test_publish_writes_only_on_change(kube_api: ControlPlane) -> None:
    node = unique("pub")
    kube_api.create_node(node)
    pub = publisher(kube_api, node)
    devices = [gpu(0), gpu(1)]
    assert pub.publish(devices, frozenset()) == 1
    (created,) = slices(kube_api, node)
    assert created["metadata"]["name"] == f"{node}-{DRIVER}-0"
    assert created["spec"]["nodeName"] == node and created["spec"]["pool"]["name"] == node
    owner = created["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", node, True)
    assert [d["name"] for d in created["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    # The same devices again: nothing written (a list is all it costs without the watch).
    before = pub.requests()
    assert pub.publish(devices, frozenset()) == 0
    assert pub.requests() == before + 1
    assert slices(kube_api, node)[0]["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # A changed list: one update, the pool's next generation.
    assert pub.publish([*devices, gpu(2)], frozenset()) == 1
    assert device_names(kube_api, node) == ["gpu-0", "gpu-1", "gpu-2"]
    assert slices(kube_api, node)[0]["spec"]["pool"]["generation"] == 2


def test_shared_gpus_are_stored_with_their_replicas_and_not_rewritten(kube_api: ControlPlane) -> None:
    from msgspec.structs import replace

    node = unique("shared")
    kube_api.create_node(node)
    pub = publisher(kube_api, node)
    shared = replace(gpu(0), replicas=10, sharing="time-slicing", resource="nvidia.com/gpu")
    mig_shared = replace(mig(1, 0), replicas=3, sharing="time-slicing")
    assert pub.publish([shared, mig_shared, gpu(2)], frozenset()) == 1
    stored = {d["name"]: d for s in slices(kube_api, node) for d in s["spec"]["devices"]}
    # The API server (DRAConsumableCapacity on, the default from 1.36) keeps the fields.
    assert stored["gpu-0"]["allowMultipleAllocations"] is True
    assert stored["gpu-0"]["capacity"]["replicas"]["value"] == "10"
    assert stored["gpu-0"]["capacity"]["replicas"]["requestPolicy"]["validRange"]["min"] == "1"
    assert stored["gpu-1-mig-1g10gb-19-0"]["capacity"]["memorySlice0"]["requestPolicy"]["default"] == "0"
    assert "allowMultipleAllocations" not in stored["gpu-2"]
    # what the server wrote back compares equal: no rewrite on the next publish
    assert pub.publish([shared, mig_shared, gpu(2)], frozenset()) == 0


def test_an_unhealthy_device_leaves_and_returns(kube_api: ControlPlane) -> None:
    node = unique("health")
    kube_api.create_node(node)
    pub = publisher(kube_api, node)
    devices = [gpu(0), gpu(1), mig(2, 0), mig(2, 1)]
    pub.publish(devices, frozenset())
    # A GPU's XID takes out the GPU; a MIG device's parent GPU takes out all of its MIG devices.
    assert pub.publish(devices, frozenset({gpu(1).uuid, gpu(2).uuid})) == 1
    assert device_names(kube_api, node) == ["gpu-0"]
    assert pub.publish(devices, frozenset({gpu(2).uuid})) == 1
    assert device_names(kube_api, node) == ["gpu-0", "gpu-1"]
    assert pub.publish(devices, frozenset()) == 1
    assert device_names(kube_api, node) == sorted(d.name for d in devices)


def test_no_device_publishes_an_empty_pool_and_a_big_one_is_split(kube_api: ControlPlane) -> None:
    node = unique("split")
    kube_api.create_node(node)
    pub = publisher(kube_api, node)
    assert pub.publish([], frozenset()) == 1
    assert [s["spec"].get("devices", []) for s in slices(kube_api, node)] == [[]]
    many = [mig(i // 7, i % 7) for i in range(130)]
    assert pub.publish(many, frozenset()) == 2
    found = slices(kube_api, node)
    assert [len(s["spec"]["devices"]) for s in found] == [128, 2]
    pools = {(s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"]) for s in found}
    assert pools == {(2, 2)}
    # Back to one slice: the obsolete one is deleted, the other rewritten.
    assert pub.publish(many[:5], frozenset()) == 2
    (left,) = slices(kube_api, node)
    assert left["spec"]["pool"] == {"name": node, "generation": 3, "resourceSliceCount": 1}
    assert pub.remove_all() == 1
    assert slices(kube_api, node) == []


def test_the_watch_re_creates_slices_someone_else_deleted(kube_api: ControlPlane) -> None:
    node = unique("wipe")
    kube_api.create_node(node)
    pub = publisher(kube_api, node)
    pub.publish([gpu(0)], frozenset())
    pub.start_watch(connect(kube_api.admin_kubeconfig))
    try:
        assert pub._watcher is not None and pub._watcher.connected.wait(10)
        time.sleep(0.5)  # let the watch's first list settle
        # Steady state: publishing the same devices sends nothing at all.
        before = pub.requests()
        for _ in range(5):
            assert pub.publish([gpu(0)], frozenset()) == 0
        assert pub.requests() == before
        # What the kubelet does when it starts: delete every slice of the node.
        kube_api.kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={node}")
        eventually(lambda: device_names(kube_api, node) == ["gpu-0"], what="slice re-created")
        # Someone else's edit is put back too.
        name = f"{node}-{DRIVER}-0"
        kube_api.kubectl("patch", "resourceslice", name, "--type=json",
                         "-p", '[{"op": "remove", "path": "/spec/devices/0/attributes/uuid"}]')
        eventually(lambda: "uuid" in slices(kube_api, node)[0]["spec"]["devices"][0]["attributes"],
                   what="edit undone")
        # A change costs its write only, and the write's echo through the watch costs nothing.
        time.sleep(1)
        settled = pub.requests()
        assert pub.publish([gpu(0), gpu(1)], frozenset()) == 1
        time.sleep(1)
        assert pub.requests() == settled + 1
        assert device_names(kube_api, node) == ["gpu-0", "gpu-1"]
        # remove_all: gone, and the watch leaves them gone.
        assert pub.remove_all() == 1
        time.sleep(1)
        assert slices(kube_api, node) == []
    finally:
        pub.stop()


def test_a_missing_node_is_a_clear_error(kube_api: ControlPlane) -> None:
    pub = publisher(kube_api, unique("absent"))
    with pytest.raises(PublishError, match=r"cannot get Node .*404.*NODE_NAME"):
        pub.publish([gpu(0)], frozenset())


# -- claims ----------------------------------------------------------------------------------------
def test_get_and_list_claims(kube_api: ControlPlane) -> None:
    namespace, name = unique("claims"), unique("claim")
    kube_api.kubectl("create", "namespace", namespace)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}
    kube_api.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    client = connect(kube_api.admin_kubeconfig)
    got = get_claim(client, namespace, name)
    assert got is not None and got["kind"] == "ResourceClaim" and got["metadata"]["uid"]
    assert got["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == DRIVER
    assert get_claim(client, namespace, "absent") is None
    listed = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in list_claims(client)}
    assert (namespace, name) in listed


# -- the chart's RBAC and admission policy ---------------------------------------------------------
RELEASE = "nvdp"
NAMESPACE = "dra-plugin"
SA = "nvdp-nvidia-device-plugin-dra-plugin"
PLUGIN_ACCOUNT = "nvdp-nvidia-device-plugin-service-account"  # the device plugin's, not needed here
POLICY_WAIT_S = 120


def slice_for(node: str, name: str | None = None, driver: str = DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{driver}-0"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []}}


def pod_token_kubeconfig(plane: ControlPlane, node: str | None) -> Path:
    """The DRA plugin's token, bound to a pod on `node` (the API server puts the node into requests
    made with it); None: a plain token of the account, bound to nothing."""
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


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(ApiError) as err:
        call()
    assert err.value.status.code == 403, err.value.status
    return str(err.value.status.message)


@pytest.fixture(scope="module")
def plane(kube_api: ControlPlane) -> ControlPlane:
    """The chart's DRA objects (ServiceAccount, RBAC, admission policy, DeviceClasses) applied once."""
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding", "DeviceClass"}
    manifests = helm_python.Chart.load(str(CHART)).render({"dra": {"enabled": True}}, name=RELEASE,
                                                          namespace=NAMESPACE, is_install=True)
    objects = [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
               for doc in yaml.safe_load_all(text)
               if doc and doc["kind"] in wanted and doc["metadata"]["name"] != PLUGIN_ACCOUNT]
    assert {o["kind"] for o in objects} == wanted
    if kube_api.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kube_api.kubectl("create", "namespace", NAMESPACE)
    kube_api.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    wait_for_policy(kube_api)
    return kube_api


def wait_for_policy(plane: ControlPlane) -> None:
    """A new policy takes a moment to be enforced: probe until another node's slice is refused."""
    mine, other = unique("probe"), unique("probe-other")
    plane.create_node(mine)
    client = connect(pod_token_kubeconfig(plane, mine))
    deadline = time.monotonic() + POLICY_WAIT_S
    last = "allowed"
    try:
        while time.monotonic() < deadline:
            try:
                create_slice(client, slice_for(other))
                delete_slice(client, f"{other}-{DRIVER}-0")
            except ApiError as err:
                last = f"{err.status.code} {err.status.message}"
                if err.status.code == 403 and "own node" in (err.status.message or ""):
                    return
            time.sleep(0.5)
    finally:
        client.close()
    raise AssertionError(f"the DRA admission policy was not enforced within {POLICY_WAIT_S} s: {last}")


def can_i(plane: ControlPlane, kubeconfig: Path, *args: str) -> bool:
    return plane.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False).stdout.strip() == "yes"


def test_the_plugin_account_publishes_and_removes_its_own_nodes_slices(plane: ControlPlane) -> None:
    node = unique("own")
    plane.create_node(node)
    kubeconfig = pod_token_kubeconfig(plane, node)
    pub = publisher(plane, node, kubeconfig)
    assert pub.publish([gpu(0)], frozenset()) == 1
    assert pub.publish([gpu(0), gpu(1)], frozenset()) == 1  # update
    pub.start_watch(connect(kubeconfig))  # list + watch are granted
    try:
        assert pub._watcher is not None and pub._watcher.connected.wait(10)
        assert pub._watcher.failures == 0
    finally:
        pub.stop()
    assert pub.remove_all() == 1  # delete
    assert slices(plane, node) == []
    client = connect(kubeconfig)
    assert list_claims(client) is not None
    for verb in ("get", "list", "watch"):
        assert can_i(plane, kubeconfig, verb, "resourceclaims.resource.k8s.io", "-A")
        assert can_i(plane, kubeconfig, verb, "nodes")
    assert can_i(plane, kubeconfig, "create", "events", "-n", "default")
    # No pods (the kubelet's pod-resources API says which use the GPUs), no claims' status without
    # migStrategy dynamic (tests/kube/test_dra_status_admission.py), Events never changed.
    for forbidden in (("update", "resourceclaims.resource.k8s.io", "-A"),
                      ("update", "resourceclaims/status", "-A"), ("patch", "resourceclaims/status", "-A"),
                      ("list", "pods", "-A"), ("patch", "events", "-n", "default"),
                      ("deletecollection", "resourceslices.resource.k8s.io"),
                      ("patch", "resourceslices.resource.k8s.io"),
                      ("create", "deviceclasses.resource.k8s.io"),
                      ("patch", "nodes"), ("get", "secrets", "-A"), ("get", "pods", "-A"),
                      ("watch", "pods", "-A")):
        assert not can_i(plane, kubeconfig, *forbidden), forbidden


def test_another_nodes_slices_are_refused(plane: ControlPlane) -> None:
    mine, other = unique("mine"), unique("other")
    plane.create_node(mine)
    plane.create_node(other)
    admin = connect(plane.admin_kubeconfig)
    theirs = create_slice(admin, slice_for(other))
    client = connect(pod_token_kubeconfig(plane, mine))
    message = refused(lambda: create_slice(client, slice_for(other, name=unique("x"))))
    assert f"on node {mine} may only write ResourceSlices of its own node, not of node {other}" in message
    message = refused(lambda: delete_slice(client, theirs["metadata"]["name"]))
    assert f"not of node {other}" in message
    # Changing another node's slice (spec.nodeName itself is immutable).
    own = create_slice(client, slice_for(mine))
    changed = {**theirs, "spec": {**theirs["spec"], "pool": {**theirs["spec"]["pool"], "generation": 2}}}
    assert f"not of node {other}" in refused(lambda: replace_slice(client, changed))
    # Another driver's slices, even on this node.
    other_driver = slice_for(mine, name=unique("y"), driver="example.com")
    assert "of driver gpu.nvidia.com, not example.com" in refused(lambda: create_slice(client, other_driver))
    # The publisher says what is wrong when its node name does not match its token.
    wrong = publisher(plane, other, pod_token_kubeconfig(plane, mine))
    with pytest.raises(PublishError, match=r"403.*its own node"):
        wrong.publish([gpu(0)], frozenset())
    delete_slice(client, own["metadata"]["name"])
    delete_slice(admin, theirs["metadata"]["name"])


def test_a_token_without_the_node_claim_is_refused(plane: ControlPlane) -> None:
    node = unique("unbound")
    plane.create_node(node)
    client = connect(pod_token_kubeconfig(plane, None))
    message = refused(lambda: create_slice(client, slice_for(node)))
    assert "not bound to a node" in message
    # Reads need no node: RBAC alone.
    assert list_slices(client, node=node, driver=DRIVER) == []


def test_the_device_classes_select_this_drivers_gpus_and_mig_devices(plane: ControlPlane) -> None:
    classes = {c["metadata"]["name"]: c for c in json.loads(
        plane.kubectl("get", "deviceclasses", "-o", "json").stdout)["items"]}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= set(classes)
    expression = classes["mig.nvidia.com"]["spec"]["selectors"][0]["cel"]["expression"]
    assert expression == ("device.driver == 'gpu.nvidia.com' "
                          "&& device.attributes['gpu.nvidia.com'].type == 'mig'")
