"""The engine-free builder (scripts/kit_images.py) starts images the way the Dockerfiles say.

It reads each Dockerfile's final stage instead of repeating it, so these tests check that the reading is
right and complete: every instruction is either mirrored or one the kit's base replaces, and the packer
gets the same entry point, environment and (root) user. tests/e2e checks the packed images themselves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import kit_images  # noqa: E402

DOCKERFILES = sorted(ROOT.glob("images/*/Dockerfile"))


def test_every_image_has_a_dockerfile_the_builder_knows() -> None:
    assert {p.parent.name for p in DOCKERFILES} == set(kit_images.IMAGES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_packer_gets_the_dockerfile_start_up(dockerfile: Path) -> None:
    spec = kit_images.read_dockerfile(dockerfile)
    text = dockerfile.read_text()
    assert spec.entrypoint and f"ENTRYPOINT {json.dumps(spec.entrypoint)}" in text
    assert spec.user is None, "the Dockerfiles run as root, as the kit's images do"
    assert spec.env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert spec.env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    args = kit_images.packer_arguments(spec, {})
    assert args[:2] == ["--entrypoint", json.dumps(spec.entrypoint)]
    envs = {args[i + 1] for i, a in enumerate(args) if a == "--env"}
    assert envs == {f"{k}={v}" for k, v in spec.env.items()}
    # Every ENV key the file sets, found independently of the parser.
    for line in text.splitlines():
        stripped = line.strip().removeprefix("ENV ")
        if (
            "=" in stripped
            and stripped.split("=")[0].isupper()
            and stripped.split("=")[0].replace("_", "").isalnum()
        ):
            assert stripped.split("=")[0] in spec.env, line


def test_stand_in_images_point_nvml_at_the_node_wide_state(tmp_path: Path) -> None:
    spec = kit_images.read_dockerfile(ROOT / "images/plugin/Dockerfile")
    args = kit_images.packer_arguments(spec, kit_images.SIM_ENV)
    assert "--env" in args and "NVML_SIM_STATE_DIR=/mps/gpu.nvidia.com/nvml-sim" in args
    assert "LD_LIBRARY_PATH=/opt/nvml-sim" in args


def test_instructions_it_cannot_mirror_are_refused(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text('FROM python:3.11-slim\nHEALTHCHECK CMD true\nENTRYPOINT ["x"]\n')
    with pytest.raises(kit_images.BuildError, match="HEALTHCHECK is not mirrored"):
        kit_images.read_dockerfile(dockerfile)
    dockerfile.write_text('FROM python:3.11-slim\nUSER 1000\nENTRYPOINT ["x"]\n')
    with pytest.raises(kit_images.BuildError, match="USER 1000"):
        kit_images.packer_arguments(kit_images.read_dockerfile(dockerfile), {})


def test_only_the_final_stage_counts(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        'FROM a AS build\nENV BUILD_ONLY=1\nFROM b\n# comment\nENV A=1 \\\n    B="two words"\n'
        'ENTRYPOINT ["run"]\nCMD ["--flag"]\nWORKDIR /w\n'
    )
    spec = kit_images.read_dockerfile(dockerfile)
    assert spec.env == {"A": "1", "B": "two words"}
    assert (spec.entrypoint, spec.cmd, spec.workdir) == (["run"], ["--flag"], "/w")


def test_archive_path_follows_the_kits_naming() -> None:
    path = kit_images.archive_path(Path("/k"), "docker.io/local/nvdp-plugin:0.1.0+x")
    assert path == Path("/k/img/nvdp-plugin_0.1.0_x.tar")
