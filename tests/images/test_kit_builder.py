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
    # No profile of their own: the chart's unsupported.simulatedGpus names one (profile_env).
    assert not [a for a in args if a.split("=")[0] in kit_images.profile_env("t4")]


def test_the_dockerfile_builds_the_stand_ins_where_the_kit_builder_does() -> None:
    # tests/e2e/Dockerfile.sim (kind, scripts/build-images.sh --stand-ins) and scripts/kit_images.py make
    # the same images: the same environment, every profile where profile_env (and so the chart) points.
    dockerfile = ROOT / "tests/e2e/Dockerfile.sim"
    assert kit_images.read_dockerfile(dockerfile).env == kit_images.SIM_ENV
    text = dockerfile.read_text()
    assert f"COPY --from=sim /out/ {kit_images.SIM_DIR}/" in text
    assert "for profile in sim/profiles/*.yaml" in text
    for path in kit_images.profile_env("$name").values():
        assert path.replace(kit_images.SIM_DIR, "/out") in text, path


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


@pytest.mark.slow  # compiles the stand-in NVML
def test_stand_in_images_carry_the_profiles_sysfs_where_the_inventory_reads_numa(tmp_path: Path) -> None:
    # The DRA plugin's resource.kubernetes.io/numaNode and the device plugin's topology come from the
    # GPU's PCI device in sysfs; the image's stand-in tree is made from the profile (sim/nvml/sysfs.py).
    from nvdp.inventory.nvml import numa_node, pcie_root

    kit_images.add_stand_ins(tmp_path)
    paths = {k: tmp_path / v.lstrip("/") for k, v in kit_images.profile_env("mixed-4").items()}
    sysfs = str(paths["NVDP_SYSFS_ROOT"])
    profile = json.loads(paths["NVML_SIM_PROFILE"].read_text())
    assert [numa_node(g["pci_bus_id"], sysfs) for g in profile["gpus"]] == [0, 0, 1, 1]
    assert [pcie_root(g["pci_bus_id"], sysfs) for g in profile["gpus"]] == [g.get("pcie_root") for g in
                                                                            profile["gpus"]]
