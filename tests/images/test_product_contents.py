"""What ships is the product only: no kubelet simulator, code generator or other test tool in the wheel or
in the released images (the simulator removes any `kubelet.sock` in the directory it is given, and the
images run where the kubelet's device-plugin directory is mounted)."""

from __future__ import annotations

import ast
import configparser
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import kit_images
import pytest

from sim.nvml import list_profiles

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(ROOT.glob("images/*/Dockerfile"))
# Top-level names of everything in the repository that is not the product.
TOOL_MODULES = {"sim", "tests", "bench", "scripts", "kubelet_sim", "generate_api", "chart_schema_sync",
                "kit_images", "demo", "grpc_tools", "pytest", "hypothesis"}  # fmt: skip
# What the images' build stages may copy from the build context.
PRODUCT_SOURCES = {"pyproject.toml", "README.md", "src"}


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def imported_top_levels(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_wheel_holds_the_package_and_its_metadata_only(wheel: Path) -> None:
    names = wheel_names(wheel)
    assert "nvdp/plugin/main.py" in names
    outside = [n for n in names if not (n.startswith("nvdp/") or n.split("/")[0].endswith(".dist-info"))]
    assert outside == []
    tools = [n for n in names if Path(n).stem in TOOL_MODULES or n.startswith(("nvdp/sim/", "nvdp/tests/"))]
    assert tools == [], f"test or build tools in the wheel: {tools}"


def test_no_module_of_the_wheel_imports_a_test_tool(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        sources = {n: archive.read(n).decode() for n in archive.namelist() if n.endswith(".py")}
    assert len(sources) > 50
    offenders = {n: sorted(imported_top_levels(s) & TOOL_MODULES) for n, s in sources.items()}
    assert {n: found for n, found in offenders.items() if found} == {}
    assert not any("KubeletSim" in s for s in sources.values())


def test_entry_points_are_the_products_commands(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(name).decode())
    scripts = dict(parser["console_scripts"])
    assert "nvdp-kubelet-sim" not in scripts
    assert {"nvidia-device-plugin", "mps-control-daemon", "nvdp", "gpu-feature-discovery"} <= set(scripts)
    names = set(wheel_names(wheel))
    for script, target in scripts.items():
        module = target.split(":")[0]
        path = module.replace(".", "/")
        found = {f"{path}.py", f"{path}/__init__.py"} & names
        assert found, f"{script} -> {target}: not a module of the wheel"
        assert not set(module.split(".")) & TOOL_MODULES, f"{script} runs a test tool ({target})"


def copied_sources(dockerfile: Path) -> list[str]:
    """The build-context sources of every COPY/ADD, in every stage (copies between stages excluded)."""
    sources: list[str] = []
    for line in kit_images.logical_lines(dockerfile.read_text(encoding="utf-8")):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() not in ("COPY", "ADD"):
            continue
        words = rest.split()
        if any(w.startswith("--from=") for w in words):
            continue
        sources += [w for w in words if not w.startswith("--")][:-1]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_release_dockerfiles_copy_the_product_sources_only(dockerfile: Path) -> None:
    sources = {s.removeprefix("./").rstrip("/") or "." for s in copied_sources(dockerfile)}
    assert "src" in sources
    assert sources <= PRODUCT_SOURCES, f"{dockerfile} copies {sorted(sources - PRODUCT_SOURCES)}"


def test_copied_sources_sees_a_stand_in_copy(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM a AS b\nCOPY --from=x /out /o\nCOPY src ./src\nCOPY sim/mps \\\n  sim/nvml /s/\n"
    )
    assert copied_sources(dockerfile) == ["src", "sim/mps", "sim/nvml"]


BASES: list[str] = []  # the root filesystems python-base.sh was run for


def kit_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wheel: Path, stand_ins: bool
) -> dict[str, list[str]]:
    """Run scripts/kit_images.py's build with the kit's two scripts replaced: the base unpacks the wheel
    into the root filesystem, the packer records what the root filesystem holds. Files by image name.
    Everything else (compiling the stand-in NVML) runs for real."""
    packed: dict[str, list[str]] = {}
    real_run = kit_images.run

    def run(argv: Sequence[str], what: str, env: dict[str, str] | None = None) -> str:
        script = Path(argv[1]).name if len(argv) > 1 else ""
        if script == "python-base.sh":
            BASES.append(argv[2])
            rootfs, wheel_file = Path(argv[2]), Path(argv[3])
            with zipfile.ZipFile(wheel_file) as unpacked:
                unpacked.extractall(rootfs / "opt/venv/lib/python3/site-packages")
        elif script == "image-from-rootfs.sh":
            rootfs, ref = Path(argv[2]), argv[3]
            packed[ref] = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*") if p.is_file())
            tar = kit_images.archive_path(tmp_path / "k8s", ref)
            tar.parent.mkdir(parents=True, exist_ok=True)
            tar.write_bytes(b"")
        else:
            return real_run(argv, what, env)  # compiling the stand-in NVML
        return ""

    monkeypatch.setattr(kit_images, "run", run)
    monkeypatch.setattr(kit_images, "build_wheel", lambda out_dir: wheel)
    monkeypatch.setattr(kit_images, "containerd_images", set)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("K8S_DIR", str(tmp_path / "k8s"))
    images = kit_images.build_images(
        tmp_path / "kit", stand_ins=stand_ins, work_dir=tmp_path / "work", log=False
    )
    assert {i.reused for i in images.values()} == {False}
    return {name: packed[image.ref] for name, image in images.items()}


def tool_files(files: list[str]) -> list[str]:
    return [f for f in files if "nvml-sim" in f or "sim/" in f or Path(f).stem in TOOL_MODULES
            or Path(f).name in ("nvidia-cuda-mps-control", "nvidia-smi")]  # fmt: skip


def test_kit_release_images_hold_the_wheel_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wheel: Path
) -> None:
    images = kit_build(monkeypatch, tmp_path, wheel, stand_ins=False)
    assert set(images) == set(kit_images.IMAGES)
    for name, files in images.items():
        assert "opt/venv/lib/python3/site-packages/nvdp/plugin/main.py" in files, name
        assert tool_files(files) == [], name


@pytest.mark.slow
def test_kit_stand_in_images_add_the_stand_ins_and_no_kubelet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wheel: Path
) -> None:
    images = kit_build(monkeypatch, tmp_path, wheel, stand_ins=True)
    for name, files in images.items():
        found = tool_files(files)
        assert "opt/nvml-sim/libnvidia-ml.so.1" in found, name
        assert "usr/local/bin/nvidia-cuda-mps-control" in found, name
        # Every node profile, where the chart's unsupported.simulatedGpus points (kit_images.profile_env).
        for profile in list_profiles():
            assert kit_images.profile_env(profile)["NVML_SIM_PROFILE"].lstrip("/") in found, (name, profile)
            sysfs = kit_images.profile_env(profile)["NVDP_SYSFS_ROOT"].lstrip("/")
            assert [f for f in found if f.startswith(f"{sysfs}/")], (name, profile)
        assert not [f for f in files if "kubelet" in f and "nvdp/" not in f], name


@pytest.mark.slow
def test_the_base_is_installed_once_for_both_images_with_and_without_stand_ins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wheel: Path
) -> None:
    BASES.clear()
    with_stand_ins = kit_build(monkeypatch, tmp_path, wheel, stand_ins=True)
    release = kit_build(monkeypatch, tmp_path, wheel, stand_ins=False)
    assert len(BASES) == 1, BASES  # then copied: 2 builds of 2 images
    assert all(tool_files(files) for files in with_stand_ins.values())
    # The copy the stand-ins went into is not the cached base: the release images stay without them.
    for name, files in release.items():
        assert tool_files(files) == [], name
