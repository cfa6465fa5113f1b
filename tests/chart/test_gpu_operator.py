"""Beside the GPU Operator: the DaemonSets that use the GPU run only where the node label
nvidia.com/gpu.deploy.client is "true" or absent, so the operator's mig-manager and driver-manager
(which set it to paused-for-mig-change / paused-for-driver-upgrade) stop them during a change."""

from __future__ import annotations

from typing import Any

from chart_helm import Manifest, merge_values, render

DEPLOY = "nvidia.com/gpu.deploy.client"
PLUGIN = "nvdp-nvidia-device-plugin"
MPS = "nvdp-nvidia-device-plugin-mps-control-daemon"
GFD = "nvdp-nvidia-device-plugin-gpu-feature-discovery"
DRA = "nvdp-nvidia-device-plugin-dra-plugin"
PRESENCE = "nvdp-nvidia-device-plugin-gpu-presence"
MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 10}\n"
DP_ENTRY = "version: v1\nflags:\n  mode: device-plugin\n"
# Every DaemonSet the chart can render: the plugin beside the DRA plugin (dra.defaultMode
# device-plugin), the MPS daemon, GPU feature discovery and the GPU presence check.
EVERYTHING = {"config": {"map": {"mps": MPS_ENTRY}}, "gfd": {"enabled": True, "detectNodes": True},
              "dra": {"enabled": True, "defaultMode": "device-plugin"}}
SEED_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "serverType", "operator": "In", "values": ["gpu"]}]}]}}}


def pod_spec(ds: Manifest) -> Manifest:
    spec: Manifest = ds["spec"]["template"]["spec"]
    return spec


def matches(affinity: Manifest | None, labels: dict[str, str]) -> bool:
    """Whether the scheduler places a pod with this affinity on a node with these labels (the
    operators the chart's terms use)."""
    if not affinity or "nodeAffinity" not in affinity:
        return True
    required = affinity["nodeAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True

    def holds(e: dict[str, Any]) -> bool:
        op, has = e["operator"], e["key"] in labels
        if op == "In":
            return has and labels[e["key"]] in e["values"]
        if op == "NotIn":
            return not has or labels[e["key"]] not in e["values"]
        if op == "Exists":
            return has
        if op == "DoesNotExist":
            return not has
        raise AssertionError(f"operator {op} not evaluated here")

    return any(all(holds(e) for e in term.get("matchExpressions", []))
               for term in required["nodeSelectorTerms"])  # fmt: skip


def test_every_daemonset_using_the_gpu_keeps_off_paused_nodes() -> None:
    sets = render(EVERYTHING).daemonsets()
    assert {PLUGIN, MPS, GFD, DRA, PRESENCE} <= set(sets)
    gpu_node = {"nvidia.com/gpu.present": "true"}
    for name in (PLUGIN, MPS, GFD, DRA):
        affinity = pod_spec(sets[name])["affinity"]
        assert matches(affinity, gpu_node), name
        assert matches(affinity, gpu_node | {DEPLOY: "true"}), name
        for paused in ("paused-for-mig-change", "paused-for-driver-upgrade", "false"):
            assert not matches(affinity, gpu_node | {DEPLOY: paused}), (name, paused)
        # and the default affinity still wants a GPU node
        assert not matches(affinity, {DEPLOY: "true"}), name
    # The presence check labels nodes (no GPU use): it runs everywhere, paused or not.
    assert "affinity" not in pod_spec(sets[PRESENCE])


def test_each_of_the_users_terms_is_kept_and_joined_with_the_label() -> None:
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "serverType", "operator": "In", "values": ["gpu"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                    "values": ["a"]}]}}],
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"x": "y"}}}]},
    }
    spec = pod_spec(render({"affinity": affinity}).one("DaemonSet", PLUGIN))
    true = {"key": DEPLOY, "operator": "In", "values": ["true"]}
    absent = {"key": DEPLOY, "operator": "DoesNotExist"}
    server = {"key": "serverType", "operator": "In", "values": ["gpu"]}
    name = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [server, true]},
            {"matchExpressions": [server, absent]},
            {"matchFields": [name], "matchExpressions": [true]},
            {"matchFields": [name], "matchExpressions": [absent]},
        ]}
    assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == (
        affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    assert spec["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]


def test_without_an_affinity_only_the_label_is_required() -> None:
    spec = pod_spec(render({"affinity": None}).one("DaemonSet", PLUGIN))
    assert spec["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": DEPLOY, "operator": "In", "values": ["true"]}]},
            {"matchExpressions": [{"key": DEPLOY, "operator": "DoesNotExist"}]},
        ]}}}


def test_turned_off_the_users_affinity_is_used_as_given() -> None:
    off = {"gpuOperator": {"respectDeployLabel": False}}
    for name, ds in render(merge_values(EVERYTHING, off, {"affinity": SEED_AFFINITY})).daemonsets().items():
        if name != PRESENCE:
            assert pod_spec(ds)["affinity"] == SEED_AFFINITY, name
    assert "affinity" not in pod_spec(render(merge_values(off, {"affinity": None})).one("DaemonSet", PLUGIN))


def test_notes_say_paused_nodes_are_left_alone() -> None:
    assert f"label {DEPLOY} is set to anything but \"true\"" in " ".join(render({}).notes.split())
    off = render({"gpuOperator": {"respectDeployLabel": False}}).notes
    assert DEPLOY not in off
