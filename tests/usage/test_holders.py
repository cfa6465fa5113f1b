"""Who holds which device, and its pod's UID: the kubelet's pod-resources answer joined with its device
checkpoint (device plugin) and the claims' reservedFor (DRA)."""

from __future__ import annotations

import json

import pytest

from nvdp.daemon.podresources.client import ContainerHold, HeldClaim
from nvdp.usage.holders import (
    CheckpointError,
    checkpoint_owners,
    claim_holders,
    claims_of,
    plugin_holders,
    reserved_pods,
)
from nvdp.usage.model import Holder

GPU0, GPU1, MIG = "GPU-aaaa", "GPU-bbbb", "MIG-cccc"
UID_A, UID_B = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"

# Kubernetes 1.20 and later: DeviceIDs by NUMA node.
CHECKPOINT = json.dumps({"Data": {"PodDeviceEntries": [
    {"PodUID": UID_A, "ContainerName": "main", "ResourceName": "nvidia.com/gpu",
     "DeviceIDs": {"0": [f"{GPU0}::0"]}, "AllocResp": "Cg=="},
    {"PodUID": UID_B, "ContainerName": "main", "ResourceName": "nvidia.com/gpu",
     "DeviceIDs": {"-1": [f"{GPU0}::1", f"{GPU0}::2"]}, "AllocResp": "Cg=="},
    {"PodUID": UID_B, "ContainerName": "side", "ResourceName": "nvidia.com/mig-1g.10gb",
     "DeviceIDs": {"0": [MIG]}, "AllocResp": "Cg=="},
], "RegisteredDevices": {"nvidia.com/gpu": [f"{GPU0}::0"]}}, "Checksum": 1234})


def test_the_checkpoint_names_each_device_ids_pod_and_container() -> None:
    assert checkpoint_owners(CHECKPOINT) == {
        ("nvidia.com/gpu", f"{GPU0}::0"): (UID_A, "main"),
        ("nvidia.com/gpu", f"{GPU0}::1"): (UID_B, "main"),
        ("nvidia.com/gpu", f"{GPU0}::2"): (UID_B, "main"),
        ("nvidia.com/mig-1g.10gb", MIG): (UID_B, "side"),
    }
    old = {"Data": {"PodDeviceEntries": [{"PodUID": UID_A, "ContainerName": "c", "ResourceName": "r",
                                          "DeviceIDs": [GPU1]}]}}
    assert checkpoint_owners(json.dumps(old)) == {("r", GPU1): (UID_A, "c")}
    assert checkpoint_owners('{"Data": {"PodDeviceEntries": null}}') == {}


@pytest.mark.parametrize("text", ["", "[]", '{"Data": 3}',
                                  '{"Data": {"PodDeviceEntries": [{"DeviceIDs": {"0": ["a"]}}]}}'])
def test_a_checkpoint_it_cannot_read_is_named_with_the_consequence(text: str) -> None:
    with pytest.raises(CheckpointError, match=r"/k/kubelet_internal_checkpoint is not a kubelet device "
                                              r"checkpoint.*usage series stay empty"):
        checkpoint_owners(text, "/k/kubelet_internal_checkpoint")


def hold(pod: str, container: str, devices: dict[str, list[str]] | None = None,
         claims: tuple[HeldClaim, ...] = (), namespace: str = "team") -> ContainerHold:
    return ContainerHold(namespace=namespace, pod=pod, container=container,
                         devices=tuple((r, tuple(ids)) for r, ids in (devices or {}).items()), claims=claims)


def test_replicas_of_one_gpu_are_one_holding_per_container_each_with_its_pods_uid() -> None:
    holds = [hold("a", "main", {"nvidia.com/gpu": [f"{GPU0}::0"]}),
             hold("b", "main", {"nvidia.com/gpu": [f"{GPU0}::1", f"{GPU0}::2"]}),
             hold("b", "side", {"nvidia.com/mig-1g.10gb": [MIG]}),
             hold("c", "main", {"nvidia.com/gpu": [GPU1]}),  # not in the checkpoint (yet)
             hold("d", "nic", {"example.com/nic": ["eth7"]})]  # another plugin's device
    owners = checkpoint_owners(CHECKPOINT)
    assert plugin_holders(holds, {GPU0, GPU1, MIG}, owners) == [
        Holder(GPU0, "team", "a", "main", UID_A, resource="nvidia.com/gpu"),
        Holder(GPU0, "team", "b", "main", UID_B, resource="nvidia.com/gpu"),
        Holder(MIG, "team", "b", "side", UID_B, resource="nvidia.com/mig-1g.10gb"),
        Holder(GPU1, "team", "c", "main", "", resource="nvidia.com/gpu"),
    ]
    assert plugin_holders(holds, {GPU1}, owners) == [Holder(GPU1, "team", "c", "main", "",
                                                            resource="nvidia.com/gpu")]


def test_claim_holders_of_this_driver_by_device_name_with_the_pods_from_reserved_for() -> None:
    shared = HeldClaim("team", "shared", (("gpu.nvidia.com", "node-a", "gpu-0"),))
    both = HeldClaim("team", "both", (("gpu.nvidia.com", "node-a", "gpu-0"),
                                      ("gpu.nvidia.com", "node-a", "gpu-7"),
                                      ("nic.example.com", "node-a", "gpu-0")))
    other = HeldClaim("team", "nic", (("nic.example.com", "node-a", "eth0"),))
    holds = [hold("a", "main", claims=(shared,)), hold("a", "side", claims=(shared,)),
             hold("b", "main", claims=(both, other))]
    assert claims_of(holds, "gpu.nvidia.com") == [("team", "shared"), ("team", "both")]
    pods = {("team", "shared"): {"a": UID_A}, ("team", "both"): {"b": UID_B}}
    holders, unknown = claim_holders(holds, "gpu.nvidia.com", {"gpu-0": GPU0}, pods)
    claim = {"driver": "gpu.nvidia.com", "pool": "node-a", "device_name": "gpu-0"}
    assert holders == [
        Holder(GPU0, "team", "a", "main", UID_A, claim_namespace="team", claim_name="shared", **claim),
        Holder(GPU0, "team", "a", "side", UID_A, claim_namespace="team", claim_name="shared", **claim),
        Holder(GPU0, "team", "b", "main", UID_B, claim_namespace="team", claim_name="both", **claim),
    ]
    assert unknown == {"gpu-7"}


def test_reserved_for_names_only_pods() -> None:
    claim = {"status": {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": UID_A},
        {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "x"},
        {"resource": "pods", "name": "b", "uid": UID_B}]}}
    assert reserved_pods(claim) == {"a": UID_A, "b": UID_B}
    assert reserved_pods({"status": {}}) == {}
    assert reserved_pods({}) == {}
