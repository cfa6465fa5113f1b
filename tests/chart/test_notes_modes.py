"""NOTES point at what the install serves: allocatable nvidia.com/gpu where the device plugin runs, the
driver's ResourceSlices and a first claim where the DRA plugin does."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_helm import ROOT, render

ALLOCATABLE = "GPU:.status.allocatable.nvidia\\.com/gpu"
SLICES = "kubectl get resourceslices --field-selector spec.driver="
DRA = {"dra": {"enabled": True}}
CLAIM_EXAMPLE = ROOT / "examples" / "dra" / "claim.yaml"


def notes(values: dict[str, Any]) -> str:
    return render(values, kube_version="v1.36.0").notes


def test_device_plugin_installs_point_at_allocatable_only() -> None:
    text = notes({})
    assert ALLOCATABLE in text
    assert SLICES not in text and "ResourceClaim" not in text


def test_dra_installs_point_at_the_drivers_slices_and_a_first_claim() -> None:
    text = notes(DRA)
    assert f"{SLICES}gpu.nvidia.com\n" in text
    assert ALLOCATABLE not in text  # no device plugin is installed: nothing would show there
    joined = " ".join(text.split())
    assert "one device of DeviceClass gpu.nvidia.com" in joined
    assert "examples/dra/claim.yaml in https://github.com/nvdp-project/nvdp" in joined
    assert "`helm test nvdp -n nvidia-device-plugin` runs the same" in joined
    assert "Pods that ask for nvidia.com/gpu in resources.limits get it through DRA" in joined


def test_the_claim_example_named_asks_for_the_class_the_notes_name() -> None:
    docs = list(yaml.safe_load_all(CLAIM_EXAMPLE.read_text(encoding="utf-8")))
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert render(DRA).one("DeviceClass", "gpu.nvidia.com")


def test_dra_notes_follow_the_driver_name_and_the_classes() -> None:
    text = notes({"dra": {"enabled": True, "driverName": "gpu.example.com", "extendedResourceNames": []}})
    assert f"{SLICES}gpu.example.com\n" in text
    assert "DeviceClass gpu.example.com" in " ".join(text.split())
    assert "resources.limits" not in text
    without = notes({"dra": {"enabled": True, "deviceClasses": False}})
    assert "dra.deviceClasses is false: claims need a DeviceClass of your own" in " ".join(without.split())
    assert "A first claim" not in without


@pytest.mark.parametrize(
    "values",
    [
        {"dra": {"enabled": True, "defaultMode": "device-plugin"}},
        {"dra": {"enabled": True}, "config": {"name": "my-configs", "default": "a"}},
    ],
)
def test_both_modes_point_at_both(values: dict[str, Any]) -> None:
    text = notes(values)
    assert "See the GPUs each node in device-plugin mode offers" in text and ALLOCATABLE in text
    assert "of each GPU node in DRA mode" in " ".join(text.split()) and SLICES in text


def test_nothing_installed_says_so() -> None:
    text = notes({"devicePlugin": {"enabled": False}})
    assert "nothing serves the nodes' GPUs" in " ".join(text.split())
    assert ALLOCATABLE not in text and SLICES not in text


def test_dra_only_installs_leave_out_the_device_plugins_mps_daemon() -> None:
    mps = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    text = notes({"dra": {"enabled": True}, "config": {"map": {"mps": mps}}})
    assert "nvidia.com/mps.capable=true" not in text
    assert "nvidia.com/mps.capable=true" in notes({"config": {"map": {"mps": mps}}})
