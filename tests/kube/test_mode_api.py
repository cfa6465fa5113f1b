"""The per-node mode's API reads against a real kube-apiserver: the pods bound to a node and the claims
they hold, the Node's allocatable, the DRA plugin's slices for the node; and the same reads with the
chart's accounts (device plugin, DRA plugin, labeller) as granted with dra.enabled: none lists pods (the
kubelet's answer; the DRA plugin adds the claims list for claims no container holds yet)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from nvdp.daemon.pernode.mode import KubeletClaim, KubeletPod, NodeApi, device_plugin_resources, gpu_pods
from nvdp.kube import connect, create_slice, delete_slice, list_node_pods
from tests.kube.envtest import ControlPlane

DRIVER = "gpu.nvidia.com"
CHART = Path(__file__).resolve().parents[2] / "charts" / "nvidia-device-plugin"
RELEASE = "nvdp"
NAMESPACE = "mode-accounts"
ACCOUNTS = {
    "device plugin": "nvdp-nvidia-device-plugin-service-account",
    "DRA plugin": "nvdp-nvidia-device-plugin-dra-plugin",
    "labeller": "nvdp-nvidia-device-plugin-gpu-feature-discovery",
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pod(name: str, namespace: str, node: str, *, gpus: int = 0, claim: str | None = None
        ) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "none"}
    spec: dict[str, Any] = {"nodeName": node, "automountServiceAccountToken": False,
                            "containers": [container]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def allocated_claim(plane: ControlPlane, namespace: str, name: str, *, driver: str, pool: str) -> None:
    """A ResourceClaim, allocated by hand as the scheduler would (status subresource)."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    status = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": pool, "device": "gpu-0"}]}}}}
    plane.kubectl("-n", namespace, "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))


def workload(plane: ControlPlane, node: str) -> str:
    """A namespace of pods on `node` (and one elsewhere); the names of those using its GPUs."""
    namespace, other = unique("work"), unique("elsewhere")
    plane.kubectl("create", "namespace", namespace)
    plane.kubectl("-n", namespace, "create", "serviceaccount", "default")  # no controller makes it here
    plane.create_node(other)
    allocated_claim(plane, namespace, "ours", driver=DRIVER, pool=node)
    allocated_claim(plane, namespace, "a-nic", driver="nic.example.com", pool=node)
    pods = [pod("train", namespace, node, gpus=1), pod("web", namespace, node),
            pod("finished", namespace, node, gpus=1), pod("claimed", namespace, node, claim="ours"),
            pod("nic", namespace, node, claim="a-nic"), pod("far", namespace, other, gpus=1)]
    plane.kubectl("create", "-f", "-",
                  input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    plane.kubectl("-n", namespace, "patch", "pod", "finished", "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"phase": "Succeeded"}}))
    return namespace


def test_the_pods_that_use_a_nodes_gpus(kube_api: ControlPlane) -> None:
    node = unique("mode")
    kube_api.create_node(node)
    namespace = workload(kube_api, node)
    client = connect(kube_api.admin_kubeconfig)
    listed = list_node_pods(client, node)
    assert sorted(p["metadata"]["name"] for p in listed) == ["claimed", "finished", "nic", "train", "web"]
    assert all(p["kind"] == "Pod" and p["spec"]["nodeName"] == node for p in listed)
    found = NodeApi(client, node, DRIVER).gpu_pods()
    assert [p.describe() for p in found] == [f"{namespace}/claimed (claim ours)",
                                             f"{namespace}/train (nvidia.com/gpu)"]
    # The server's JSON, classified offline as the unit tests do.
    assert [p.name for p in gpu_pods(listed, None, driver=None, node=node)] == ["train"]
    assert NodeApi(client, unique("empty"), DRIVER).gpu_pods() == []


def test_allocatable_and_slices_of_a_node(kube_api: ControlPlane) -> None:
    node = unique("mode")
    kube_api.create_node(node)
    client = connect(kube_api.admin_kubeconfig)
    api = NodeApi(client, node, DRIVER)
    assert device_plugin_resources(api.allocatable()) == []
    status = {"status": {"capacity": {"nvidia.com/gpu": "2", "cpu": "4"},
                         "allocatable": {"nvidia.com/gpu": "2", "cpu": "4"}}}
    kube_api.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    assert device_plugin_resources(api.allocatable()) == ["nvidia.com/gpu=2"]
    status["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # the kubelet's answer to a stopped plugin
    kube_api.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    assert device_plugin_resources(api.allocatable()) == []
    assert api.slices_left() == 0
    name = f"{node}-{DRIVER}-0"
    create_slice(client, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                          "metadata": {"name": name},
                          "spec": {"driver": DRIVER, "nodeName": node, "devices": [],
                                   "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}})
    assert api.slices_left() == 1
    assert NodeApi(client, node, "other.example.com").slices_left() == 0
    assert NodeApi(client, node, None).slices_left() == 0
    delete_slice(client, name)
    assert api.slices_left() == 0


def can_list_pods(plane: ControlPlane, kubeconfig: Path) -> bool:
    done = plane.kubectl("auth", "can-i", "list", "pods", "-A", kubeconfig=kubeconfig, check=False)
    return done.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def accounts(kube_api: ControlPlane) -> dict[str, Path]:
    """The chart's accounts and roles for dra.enabled with per-node entries and the labeller; a token
    kubeconfig for each."""
    values = {"dra": {"enabled": True}, "gfd": {"enabled": True},
              "config": {"map": {"dp": "version: v1\nflags:\n  mode: device-plugin\n",
                                 "dra": "version: v1\nflags:\n  mode: dra\n"}, "default": "dp"}}
    manifests = helm_python.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE,
                                                          is_install=True)
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    objects = [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
               for doc in yaml.safe_load_all(text) if doc and doc["kind"] in wanted]
    if kube_api.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kube_api.kubectl("create", "namespace", NAMESPACE)
    kube_api.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return {who: kube_api.service_account_kubeconfig(NAMESPACE, name) for who, name in ACCOUNTS.items()}


@pytest.mark.parametrize("who", list(ACCOUNTS))
def test_the_charts_accounts_may_make_the_reads_of_a_switch(kube_api: ControlPlane, accounts: dict[str, Path],
                                                            who: str) -> None:
    node = unique("mode")
    kube_api.create_node(node)
    namespace = workload(kube_api, node)
    # No account lists pods: the kubelet's pod-resources API says which it runs (here what the kubelet
    # would answer for the workload: the finished pod not listed, the far one on another node); the DRA
    # plugin also lists claims, for those allocated here that no container holds yet.
    ours = KubeletClaim(namespace, "ours", ((DRIVER, node),))
    nic = KubeletClaim(namespace, "a-nic", (("nic.example.com", node),))
    answer = [KubeletPod(namespace, "train", resources=("nvidia.com/gpu",)),
              KubeletPod(namespace, "web"), KubeletPod(namespace, "claimed", claims=(ours,)),
              KubeletPod(namespace, "nic", claims=(nic,))]
    assert not can_list_pods(kube_api, accounts[who])
    dra = who == "DRA plugin"
    api = NodeApi(connect(accounts[who]), node, DRIVER, all_claims=dra, kubelet_pods=lambda: answer)
    assert [p.name for p in api.gpu_pods()] == ["train", "claimed"], namespace
    if dra:
        assert [p.describe() for p in NodeApi(connect(accounts[who]), node, DRIVER, all_claims=True,
                                                kubelet_pods=lambda: answer[:2]).gpu_pods()] == [
            f"{namespace}/train (nvidia.com/gpu)",
            f"{namespace}/ours (a claim allocated here, no container on the node holds it yet)"]
    if who == "DRA plugin":  # waits for the device plugin to withdraw
        assert "nvidia.com/gpu" not in api.allocatable()
    if who == "device plugin":  # waits for the DRA plugin's slices to go
        assert api.slices_left() == 0
