"""The images the suite built start the way the Dockerfiles say (entry point, environment, user)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from .e2e_cluster import ROOT, Images

sys.path.insert(0, str(ROOT / "scripts"))
import kit_images


def image_config(archive: Path) -> dict[str, Any]:
    """The container config of a docker-archive (manifest.json -> config blob)."""
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config: dict[str, Any] = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    container: dict[str, Any] = config["config"]
    return container


@pytest.mark.parametrize("name", sorted(kit_images.IMAGES))
def test_image_starts_as_its_dockerfile_says(images: Images, name: str) -> None:
    if name not in images.archives:
        pytest.skip("this backend builds with the Dockerfiles themselves")
    spec = kit_images.read_dockerfile(ROOT / "images" / name / "Dockerfile")
    config = image_config(images.archives[name])
    assert config.get("Entrypoint") == spec.entrypoint
    assert config.get("Cmd") in (None, spec.cmd)
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    assert {k: env.get(k) for k in spec.env} == spec.env
    assert config.get("User", "") in ("", "root", "0"), "the Dockerfiles run as root"
    # The stand-ins the suite adds on top, pointing NVML at the node-wide state folder; no profile: the
    # chart's unsupported.simulatedGpus names one when a container starts.
    assert {k: env.get(k) for k in kit_images.SIM_ENV} == kit_images.SIM_ENV
    assert env["NVML_SIM_STATE_DIR"] == kit_images.SIM_STATE_DIR
    assert not set(env) & set(kit_images.profile_env("t4")), env
