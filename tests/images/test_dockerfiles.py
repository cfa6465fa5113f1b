"""Every Dockerfile under images/: hadolint clean, and its entry point is a console script of the wheel."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(ROOT.glob("images/*/Dockerfile"))
HADOLINT = Path(sys.executable).with_name("hadolint")


def dockerfile_id(path: Path) -> str:
    return path.parent.name


def exec_form(dockerfile: Path, instruction: str) -> list[str] | None:
    """The JSON (exec) form of the last ENTRYPOINT/CMD, None when absent; shell form fails the test."""
    found = None
    for line in dockerfile.read_text().splitlines():
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].upper() == instruction:
            value = json.loads(words[1])  # the shell form would not parse: it breaks signal delivery
            assert isinstance(value, list) and all(isinstance(v, str) for v in value), line
            found = value
    return found


@pytest.fixture(scope="session")
def console_scripts(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(name).decode())
    return set(parser["console_scripts"])


def test_images_exist() -> None:
    assert ROOT / "images/plugin/Dockerfile" in DOCKERFILES


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=dockerfile_id)
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run([str(HADOLINT), str(dockerfile)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=dockerfile_id)
def test_entry_point_is_a_console_script_of_the_wheel(dockerfile: Path, console_scripts: set[str]) -> None:
    command = exec_form(dockerfile, "ENTRYPOINT") or exec_form(dockerfile, "CMD")
    assert command, f"{dockerfile} has neither ENTRYPOINT nor CMD"
    program = command[0]
    if program.startswith("/"):
        pytest.skip(f"{dockerfile} runs {program}, not a console script")
    assert program in console_scripts, f"{program} is not among the wheel's scripts {sorted(console_scripts)}"


def test_plugin_image_environment() -> None:
    text = (ROOT / "images/plugin/Dockerfile").read_text()
    for setting in ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                    "NVIDIA_DISABLE_REQUIRE=true"):
        assert setting in text
    assert exec_form(ROOT / "images/plugin/Dockerfile", "ENTRYPOINT") == ["nvidia-device-plugin"]
    bases = [line.split()[1] for line in text.splitlines() if line.startswith("ARG PYTHON_IMAGE=")]
    assert bases and all("slim" in b and b.split(":")[1][0].isdigit() for b in bases), bases
