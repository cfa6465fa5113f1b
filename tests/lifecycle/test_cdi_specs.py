"""The plugin's side of the CDI specs (nvdp.plugin.cdi_specs): what is written when, what a failure
leaves, and that a plugin without a CDI strategy never loads nvdp.cdi."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from nvdp.cdi.build import SpecSet
from nvdp.cdi.spec import ContainerEdits, Device, DeviceNode, Spec
from nvdp.config.loader import load_config
from nvdp.daemon.errors import StartupError
from nvdp.plugin.cdi_specs import CdiSpecs, build, classes, spec_dir

from .fakes import gpu, inventory

pytestmark = pytest.mark.slow  # starts processes

LOG = logging.getLogger("test.cdi_specs")
VENDOR = "k8s.device-plugin.nvidia.com"


def spec_set(*names: str, cls: str = "gpu") -> SpecSet:
    edits = ContainerEdits(device_nodes=(DeviceNode(path="/dev/nvidia0", host_path="/dev/nvidia0"),))
    devices = tuple(Device(name=n, container_edits=edits) for n in names)
    return SpecSet((Spec(cdi_version="0.5.0", kind=f"{VENDOR}/{cls}", devices=devices,
                         container_edits=ContainerEdits()),))


def names_on_disk(directory: Path) -> list[str]:
    spec = json.loads((directory / f"{VENDOR}-gpu.json").read_text())
    return sorted(d["name"] for d in spec["devices"])


def test_stage_writes_the_union_and_settle_the_new_set(tmp_path: Path) -> None:
    specs = CdiSpecs(str(tmp_path), LOG)
    specs.stage(spec_set("GPU-1", "all"))
    assert names_on_disk(tmp_path) == ["GPU-1", "all"]
    new = spec_set("0", "all")
    specs.stage(new)
    assert names_on_disk(tmp_path) == ["0", "GPU-1", "all"]  # both plans' names resolve meanwhile
    specs.settle(new)
    assert names_on_disk(tmp_path) == ["0", "all"]
    assert specs.written == new


def test_cdi_turned_off_leaves_the_files(tmp_path: Path) -> None:
    specs = CdiSpecs(str(tmp_path), LOG)
    specs.stage(spec_set("GPU-1"))
    specs.stage(None)
    specs.settle(None)
    assert names_on_disk(tmp_path) == ["GPU-1"]


def test_a_failed_stage_changes_nothing_and_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    specs = CdiSpecs(str(blocker / "cdi"), LOG)  # a folder cannot be made inside a file
    with pytest.raises(StartupError, match="cannot write the CDI specs before registering: cannot create"):
        specs.stage(spec_set("GPU-1"))
    assert specs.written is None


def test_a_failed_settle_is_a_warning_and_the_union_stays(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    specs = CdiSpecs(str(tmp_path), LOG)
    specs.stage(spec_set("GPU-1"))
    new = spec_set("0")
    specs.stage(new)
    specs.directory = str(tmp_path / "gone" / "x")
    (tmp_path / "gone").write_text("")
    with caplog.at_level(logging.WARNING):
        specs.settle(new)
    assert "the specs written before the re-plan stay" in caplog.text
    assert names_on_disk(tmp_path) == ["0", "GPU-1"]


def test_env_moves_the_folder() -> None:
    assert spec_dir({"NVDP_CDI_DIR": "/tmp/cdi"}) == "/tmp/cdi"
    assert spec_dir({}) is None  # nvdp.cdi.write.CDI_DIR, once there is a spec to write


def test_build_without_a_cdi_strategy_is_none_and_its_errors_are_startup_errors(tmp_path: Path) -> None:
    inv = inventory(gpu(0))
    from nvdp.plan import plan

    config = load_config(None, {}, {})
    assert build(config, inv, plan(config, inv)) is None
    assert classes(None) == frozenset()
    broken = load_config(None, {"DEVICE_LIST_STRATEGY": "cdi-cri",
                                "DRIVER_ROOT_CTR_PATH": str(tmp_path / "empty")}, {})
    (tmp_path / "empty").mkdir()
    expected = r"cannot generate the CDI specs \(deviceListStrategy cdi-cri\): no libcuda.so.550.54.15 under"
    with pytest.raises(StartupError, match=expected):
        build(broken, inv, plan(broken, inv))


def test_the_plugin_without_cdi_loads_no_spec_builder() -> None:
    # Allocate's names come from nvdp.cdi.names, which imports nothing; the rest of nvdp.cdi (host
    # discovery, builders, writer) loads only where a CDI strategy serves.
    code = ("import sys, nvdp.plugin.main, nvdp.plugin.prepare, nvdp.plugin.allocate; "
            "from nvdp.plugin.cdi_specs import CdiSpecs, spec_dir; CdiSpecs(spec_dir({}), None).stage(None); "
            "print(sorted(m for m in sys.modules if m.startswith('nvdp.cdi')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['nvdp.cdi', 'nvdp.cdi.names']"
