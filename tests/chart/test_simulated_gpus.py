"""unsupported.simulatedGpus: the stand-in images for clusters without GPUs (kind), never by default.

With the value, every container of every DaemonSet and the helm test pod run the stand-in images
`<repository>-sim` (what scripts/build-images.sh --stand-ins builds, with every node profile) with the
environment that shows them the profile named, every object and pod carries the label
`unsupported-simulated-gpus`, and NOTES.txt starts with a warning. Without it, none of that renders, for
any values file of the chart's ci/ folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helm import (
    CHART_DIR,
    Manifest,
    Rendered,
    ci_values_files,
    merge_values,
    render,
    render_error,
    values_file,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import kit_images

LABEL = "unsupported-simulated-gpus"
APP_VERSION = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]
MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
# Every DaemonSet the chart has: the device plugin, its MPS daemon, GFD, node detection, the DRA plugin
# and its MPS daemons (dra.defaultMode device-plugin keeps the device plugin beside the DRA plugin).
EVERYTHING: dict[str, Any] = {
    "config": {"map": {"default": MPS_CONFIG}},
    "gfd": {"enabled": True, "detectNodes": True},
    "dra": {"enabled": True, "defaultMode": "device-plugin"},
}
DAEMONSETS = {"nvdp-nvidia-device-plugin", "nvdp-nvidia-device-plugin-mps-control-daemon",
              "nvdp-nvidia-device-plugin-gpu-feature-discovery", "nvdp-nvidia-device-plugin-gpu-presence",
              "nvdp-nvidia-device-plugin-dra-plugin", "nvdp-nvidia-device-plugin-dra-mps"}


def containers(rendered: Rendered) -> dict[str, Manifest]:
    """Every container of the DaemonSets and the helm test pod, keyed "<object>/<container>"."""
    found: dict[str, Manifest] = {}
    for obj in rendered.objects:
        if obj["kind"] not in ("DaemonSet", "Pod"):
            continue
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj.get("spec", {})
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            found[f"{obj['metadata']['name']}/{c['name']}"] = c
    return found


def images(rendered: Rendered) -> dict[str, str]:
    """Every container's image, keyed "<object>/<container>"."""
    return {where: c["image"] for where, c in containers(rendered).items()}


def env(container: Manifest) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def labelled(obj: Manifest) -> dict[str, str]:
    labels: dict[str, str] = obj["metadata"].get("labels") or {}
    return labels


@pytest.fixture(scope="module")
def simulated() -> Rendered:
    return render(merge_values(EVERYTHING, {"unsupported": {"simulatedGpus": "t4"}}))


def test_every_daemonset_is_covered(simulated: Rendered) -> None:
    assert set(simulated.daemonsets()) == DAEMONSETS


def test_every_container_runs_a_stand_in_image(simulated: Rendered) -> None:
    found = images(simulated)
    plugin = f"ghcr.io/nvdp-project/nvdp-plugin-sim:{APP_VERSION}"
    mps = f"ghcr.io/nvdp-project/nvdp-mps-daemon-sim:{APP_VERSION}"
    assert found and set(found.values()) == {plugin, mps}, found
    assert found["nvdp-nvidia-device-plugin/nvidia-device-plugin-ctr"] == plugin
    assert {image for where, image in found.items() if "mps" in where.split("/")[0]} == {mps}
    # helm test: the plugin's stand-in image, whose nvidia-smi -L lists the simulated GPUs.
    assert found["nvdp-nvidia-device-plugin-test-gpu/nvidia-smi"] == plugin


def test_every_container_is_shown_the_profile(simulated: Rendered) -> None:
    # The stand-in images carry every profile; the environment picks one, where the builders put it.
    wanted = kit_images.profile_env("t4")
    for where, container in containers(simulated).items():
        assert {k: env(container).get(k) for k in wanted} == wanted, where


def test_every_object_and_pod_says_it_is_simulated(simulated: Rendered) -> None:
    unlabelled = [f"{o['kind']}/{o['metadata']['name']}" for o in simulated.objects
                  if labelled(o).get(LABEL) != "t4"]
    assert not unlabelled
    for name, daemonset in simulated.daemonsets().items():
        assert daemonset["spec"]["template"]["metadata"]["labels"][LABEL] == "t4", name
        # The selector stays as it was: switching the value on or off is an upgrade, not a new DaemonSet.
        assert LABEL not in daemonset["spec"]["selector"]["matchLabels"], name


def test_notes_start_with_the_warning(simulated: Rendered) -> None:
    second_paragraph = simulated.notes.split("\n\n")[1]
    assert second_paragraph.startswith("WARNING: UNSUPPORTED, SIMULATED GPUS (unsupported.simulatedGpus=t4)")
    assert "never install this on GPU nodes" in second_paragraph


def test_the_images_follow_repository_and_tag() -> None:
    rendered = render(merge_values(EVERYTHING, {
        "unsupported": {"simulatedGpus": "a100-sxm-8"},
        "image": {"repository": "registry.example.com/gpu/nvdp-plugin", "tag": "dev"},
        "mpsImage": {"repository": "registry.example.com/gpu/nvdp-mps-daemon", "tag": "dev"}}))
    assert set(images(rendered).values()) == {"registry.example.com/gpu/nvdp-plugin-sim:dev",
                                              "registry.example.com/gpu/nvdp-mps-daemon-sim:dev"}
    wanted = kit_images.profile_env("a100-sxm-8")
    assert {env(c)["NVML_SIM_PROFILE"] for c in containers(rendered).values()} == {wanted["NVML_SIM_PROFILE"]}


@pytest.mark.parametrize("values", [{}, EVERYTHING, *(values_file(p) for p in ci_values_files())],
                         ids=["default", "everything", *(p.name for p in ci_values_files())])
def test_without_the_value_nothing_simulated_renders(values: dict[str, Any]) -> None:
    rendered = render(values)
    found = images(rendered)
    assert found and not [image for image in found.values() if "-sim:" in image], found
    assert not [where for where, c in containers(rendered).items()
                if set(env(c)) & set(kit_images.profile_env("t4"))]
    assert not [o["metadata"]["name"] for o in rendered.objects if LABEL in labelled(o)]
    assert not [name for name, ds in rendered.daemonsets().items()
                if LABEL in ds["spec"]["template"]["metadata"]["labels"]]
    assert "SIMULATED" not in rendered.notes
    assert found.get("nvdp-nvidia-device-plugin-test-gpu/nvidia-smi", "").startswith("nvcr.io/nvidia/cuda:")


def test_the_default_is_off() -> None:
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert defaults["unsupported"] == {"simulatedGpus": ""}


@pytest.mark.parametrize("profile", ["T4", "t4 gpu", "../t4", "-t4"])
def test_a_value_that_is_no_profile_name_is_refused(profile: str) -> None:
    message = render_error({"unsupported": {"simulatedGpus": profile}})
    assert "simulatedGpus" in message
