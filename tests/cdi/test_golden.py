"""nvdp's CDI specs against NVIDIA's, device for device and edit for edit (any order).

NVIDIA's specs (tests/cdi/data/nvidia-<case>.json) come from NVIDIA's plugin v0.20.0 on NVIDIA's mock
NVML with a fake driver root (scripts/cdi_golden.py, which also builds the root). Here the same root
is built again, the GPUs are read through pynvml from the same mock, and nvdp's specs are compared.
The differences nvdp makes on purpose (docs/cdi.md) are applied to NVIDIA's side first, each with
its reason, or checked on their own:

- nvdp adds a device `all` (the union of the others' edits); NVIDIA's plugin passes no merged-device
  option. Checked to be that union.
- the DRM by-path link of the create-symlinks hook: NVIDIA writes the link under the plugin's own
  dev root (`/driver-root/dev/dri/by-path/...`, a path that exists only in the plugin's container;
  hook arguments are not root-transformed), nvdp the container's `/dev/dri/by-path/...`.
- with every hook disabled nvdp mounts each library at its SONAME and link paths too (checked against
  an explicit list), since nothing else makes those links in the container.

Building the root needs root (mknod); without it the tests skip and say why. A slow test runs NVIDIA's
plugin again and checks that the saved files are still what it writes on today's fake root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cdi_golden import (
    CASES,
    DRIVER_VERSION,
    LIB_DIR,
    ROOT_MARK,
    UPSTREAM_SHARED,
    Case,
    build_fake_root,
    drm_bus_id,
    fake_sysfs,
    golden_path,
    normalise,
    unpack_upstream,
    why_cannot_run,
    with_private_dev,
)

from nvdp.cdi.build import build_specs
from nvdp.cdi.host import discover_host
from nvdp.cdi.spec import encode
from nvdp.config.model import Config, Flags, Imex, PluginFlags
from nvdp.inventory.model import Inventory
from nvdp.plan import plan
from tests.cdi.cdischema import schema_errors
from tests.cdi.compare import Tally, compare_spec

REASON = why_cannot_run()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"golden CDI comparison: {REASON}"),
]

DISCOVER = """
import sys, msgspec
from nvdp.inventory.nvml import discover
sys.stdout.buffer.write(msgspec.json.encode(discover("/", sys.argv[1])))
"""


@pytest.fixture(scope="module")
def upstream() -> Path:
    return unpack_upstream()


def inventory_from_mock(upstream: Path, root: Path, case: Case) -> Inventory:
    """The GPUs as nvdp reads them, through pynvml, from NVIDIA's mock NVML in the fake root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVML_SIM_", "MOCK_NVML"))}
    env.update(LD_LIBRARY_PATH=str(upstream / "lib"), MOCK_NVML_CONFIG=str(UPSTREAM_SHARED / "mock-profiles" /
                                                                           case.profile))
    argv = with_private_dev([sys.executable, "-c", DISCOVER, str(root)])
    result = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr.decode()
    return msgspec.json.decode(result.stdout, type=Inventory)


def config_for(case: Case, root: Path) -> Config:
    extra: dict[str, Any] = {}
    if case.feature_flags:
        extra["cdi_feature_flags"] = case.feature_flags
    if case.disable_hooks:
        extra["cdi_disable_hooks"] = case.disable_hooks
    plugin = PluginFlags(device_list_strategy=("cdi-annotations",), device_id_strategy=case.id_strategy,  # type: ignore[arg-type]
                         nvidia_ctk_path=case.hook_path, container_driver_root=str(root), **extra)
    flags = Flags(nvidia_driver_root="/", gdrcopy_enabled="gdrcopy" in case.gated,
                  gds_enabled="gds" in case.gated, mofed_enabled="mofed" in case.gated, plugin=plugin)
    return Config(flags=flags, imex=Imex(channel_ids=case.imex_channels))


def nvdp_specs(case: Case, upstream: Path, work: Path) -> dict[str, Any]:
    root = work / "root"
    bus = drm_bus_id(case.profile)
    build_fake_root(root, upstream / "lib" / f"libnvidia-ml.so.{DRIVER_VERSION}", bus)
    fake_sysfs(work / "sys", bus)
    (work / "proc").mkdir()
    inventory = inventory_from_mock(upstream, root, case)
    config = config_for(case, root)
    facts = discover_host(config, inventory, sysfs_root=str(work / "sys"), proc_root=str(work / "proc"),
                          environ={"PATH": "/usr/bin:/bin"})
    specs = build_specs(config, inventory, plan(config, inventory), facts)
    return {s.cls: normalise(json.loads(encode(s)), str(root)) for s in specs.specs}


def nvidia_with_nvdp_differences(theirs: dict[str, Any]) -> dict[str, Any]:
    """NVIDIA's specs with the by-path link written at the container's path (see the module docstring)."""
    text = json.dumps(theirs).replace(f"::{ROOT_MARK}/dev/dri/by-path/", "::/dev/dri/by-path/")
    expected: dict[str, Any] = json.loads(text)
    return expected


def check_all_device(ours: dict[str, Any]) -> dict[str, Any]:
    """The gpu spec without `all`, after checking that `all` is the union of the other devices' edits."""
    gpu = ours["gpu"]
    every = next(d for d in gpu["devices"] if d["name"] == "all")["containerEdits"]
    others = [d["containerEdits"] for d in gpu["devices"] if d["name"] != "all"]
    for name in ("deviceNodes", "hooks", "additionalGids"):
        union = {json.dumps(e, sort_keys=True) for edits in others for e in edits.get(name, [])}
        assert {json.dumps(e, sort_keys=True) for e in every.get(name, [])} == union, name
    return {**ours, "gpu": {**gpu, "devices": [d for d in gpu["devices"] if d["name"] != "all"]}}


HOOKLESS_MOUNTS = {  # container path -> the file mounted there (both in LIB_DIR)
    "libcuda.so.1": f"libcuda.so.{DRIVER_VERSION}",  # SONAME
    "libcuda.so": f"libcuda.so.{DRIVER_VERSION}",  # what the hook's libcuda.so link reaches
    "libnvidia-ml.so.1": f"libnvidia-ml.so.{DRIVER_VERSION}",
    "libnvidia-ml.so": f"libnvidia-ml.so.{DRIVER_VERSION}",
    "libnvidia-ptxjitcompiler.so.1": f"libnvidia-ptxjitcompiler.so.{DRIVER_VERSION}",
    "libGLX_indirect.so.0": f"libGLX_nvidia.so.{DRIVER_VERSION}",
    "libnvidia-vulkan-producer.so": f"libnvidia-vulkan-producer.so.{DRIVER_VERSION}",
}


def take_hookless_mounts(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """nvdp's gpu spec without the mounts NVIDIA's has not, after checking they are HOOKLESS_MOUNTS (and
    the GLX server module's .so beside it)."""
    common = ours["gpu"]["containerEdits"]
    known = {m["containerPath"] for m in theirs["gpu"]["containerEdits"]["mounts"]}
    extra = {m["containerPath"]: m["hostPath"] for m in common["mounts"] if m["containerPath"] not in known}
    lib = f"/{LIB_DIR}"
    xorg = "/usr/lib/xorg/modules/extensions"
    expected = {f"{lib}/{link}": f"{lib}/{file}" for link, file in HOOKLESS_MOUNTS.items()}
    expected[f"{xorg}/libglxserver_nvidia.so"] = f"{xorg}/libglxserver_nvidia.so.{DRIVER_VERSION}"
    assert extra == expected
    kept = [m for m in common["mounts"] if m["containerPath"] in known]
    return {**ours, "gpu": {**ours["gpu"], "containerEdits": {**common, "mounts": kept}}}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nvdp_spec_matches_nvidia(case: Case, upstream: Path, tmp_path: Path) -> None:
    theirs = json.loads(golden_path(case).read_text())
    ours = nvdp_specs(case, upstream, tmp_path)
    assert {cls: schema_errors(spec) for cls, spec in ours.items()} == {cls: [] for cls in ours}
    ours = check_all_device(ours)
    if "all" in case.disable_hooks:
        ours = take_hookless_mounts(ours, theirs)
    expected = nvidia_with_nvdp_differences(theirs)
    assert sorted(ours) == sorted(expected) == sorted(case.classes)
    tally = Tally()
    for cls in expected:
        compare_spec(cls, expected[cls], ours[cls], tally)
    print(f"{case.name}: {tally.devices} devices, {tally.entries} edit entries compared")
    assert tally.differences == []
    assert tally.devices >= 8  # a comparison of nothing would pass too


@pytest.mark.slow
def test_the_golden_files_are_what_nvidias_plugin_writes_now() -> None:
    """NVIDIA's plugin run again on today's fake root writes exactly the saved specs (a change to the
    root in scripts/cdi_golden.py needs the files regenerated)."""
    script = Path(__file__).parents[2] / "scripts/cdi_golden.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr
