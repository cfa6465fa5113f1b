"""NOTES explain where the plugin runs (the e2e suite checks the node count `lookup` adds on a cluster)."""

from __future__ import annotations

from chart_helm import render


def test_default_notes_name_the_labels_and_how_to_replace_the_affinity() -> None:
    notes = render({}).notes
    assert "  - feature.node.kubernetes.io/pci-10de.present=true" in notes
    assert "  - nvidia.com/gpu.present=true" in notes
    assert "kubectl label node <node> nvidia.com/gpu.present=true" in notes
    assert "replace `affinity`" in notes
    # Offline (helm template) the cluster cannot be asked, so no count is claimed.
    assert "Matching nodes" not in notes


def test_own_affinity_and_node_selector_are_spelled_out() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "serverType", "operator": "In", "values": ["gpu"]},
                              {"key": "pool", "operator": "Exists"}]},
    ]}}}  # fmt: skip
    notes = render({"affinity": affinity, "nodeSelector": {"zone": "a"}}).notes
    assert "  - serverType=gpu and label pool set" in notes
    assert 'the nodeSelector {"zone":"a"}' in notes
    assert "kubectl label node <node> nvidia.com/gpu.present=true" not in notes


def test_mps_without_host_pid_tells_how_to_make_the_shared_mount() -> None:
    config = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    notes = render({"config": {"map": {"config": config}}, "mps": {"enableHostPID": False}}).notes
    assert "mount --make-rshared /run/nvidia/mps" in notes
    assert "mount --make-rshared" not in render({"config": {"map": {"config": config}}}).notes
