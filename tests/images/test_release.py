"""The release workflow and scripts/build-images.sh publish the images where the chart's defaults point."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github/workflows/release.yaml"
VALUES = yaml.safe_load((ROOT / "charts/nvidia-device-plugin/values.yaml").read_text())


def test_workflow_pushes_both_images_for_amd64_and_arm64_where_values_point() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["images"]
    images = job["strategy"]["matrix"]["image"]
    assert sorted(images) == sorted(p.parent.name for p in ROOT.glob("images/*/Dockerfile"))
    (build,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("docker/build-push-action")]
    assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["with"]["push"] is True
    tag = build["with"]["tags"].replace("${{ env.REGISTRY }}", workflow["env"]["REGISTRY"])
    pushed = {tag.replace("${{ matrix.image }}", image).rsplit(":", 1)[0] for image in images}
    assert pushed == {VALUES["image"]["repository"], VALUES["mpsImage"]["repository"]}
    # Tagged with appVersion, which is what an empty image.tag resolves to.
    assert tag.endswith(":${{ steps.version.outputs.version }}")
    assert VALUES["image"]["tag"] == "" and VALUES["mpsImage"]["tag"] == ""


def test_build_script_defaults_to_the_same_names() -> None:
    script = (ROOT / "scripts/build-images.sh").read_text()
    registry = re.search(r'REGISTRY="\$\{REGISTRY:-([^}]+)\}"', script)
    assert registry is not None
    for key in ("image", "mpsImage"):
        assert VALUES[key]["repository"].startswith(registry.group(1) + "/nvdp-")
