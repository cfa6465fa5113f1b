"""`nvdp doctor`'s CDI checks: the spec directories read as the CDI library reads them, every name the
plugin would return resolved there, and the hook looked for as the plugin looks for it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.config.loader import load_config
from nvdp.config.model import Config
from nvdp.doctor.cdi_check import CdiChecks, planned_names
from nvdp.doctor.cdi_specs import read_dirs, resolve
from nvdp.doctor.checks import Doctor, Where
from nvdp.doctor.report import Finding
from nvdp.plan import plan
from sim.nvml import NodeSim

VENDOR = "k8s.device-plugin.nvidia.com"
T4_UUID = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"


def spec(cls: str, *names: str, version: str = "0.5.0") -> dict[str, Any]:
    node = {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}
    return {
        "cdiVersion": version,
        "kind": f"{VENDOR}/{cls}",
        "devices": [{"name": n, "containerEdits": {"deviceNodes": [node]}} for n in names],
        "containerEdits": {},
    }


def put(directory: Path, name: str, content: dict[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(content, str):
        path.write_text(content)
    elif name.endswith(".yaml"):
        import yaml

        path.write_text("---\n" + yaml.safe_dump(content))
    else:
        path.write_text(json.dumps(content))
    return path


def gpu(name: str) -> str:
    return f"{VENDOR}/gpu={name}"


def test_a_later_directory_wins_and_yaml_counts(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    put(etc, "nvidia.yaml", spec("gpu", "0", "all"))
    put(run, f"{VENDOR}-gpu.json", spec("gpu", "0"))
    resolved = read_dirs([etc, run])
    assert resolved.names == {gpu("0"): str(run / f"{VENDOR}-gpu.json"), gpu("all"): str(etc / "nvidia.yaml")}
    assert resolved.conflicts == {} and resolved.skipped == {}


def test_a_name_twice_in_one_directory_resolves_nowhere_even_if_a_later_one_has_it(tmp_path: Path) -> None:
    """As CDI's cache: a same-priority conflict removes the name once every directory was read."""
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    first = put(etc, "a.json", spec("gpu", "0", "1"))
    second = put(etc, "b.json", spec("gpu", "0"))
    put(run, "c.json", spec("gpu", "0"))
    resolved = read_dirs([etc, run])
    assert gpu("0") not in resolved.names and gpu("1") in resolved.names
    assert resolved.conflicts == {gpu("0"): (str(first), str(second))}


def test_files_a_loader_skips_define_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run-cdi"
    put(run, "broken.json", "{not json")
    put(run, "unknown-field.json", {**spec("gpu", "0"), "extra": 1})
    put(run, "too-old.json", spec("gpu", "1", version="0.3.0"))  # a digit-led name needs 0.5.0
    put(run, "ignored.txt", json.dumps(spec("gpu", "2")))  # neither .json nor .yaml
    put(run, "ok.json", spec("gpu", "3"))
    resolved = read_dirs([tmp_path / "absent", run])
    assert list(resolved.names) == [gpu("3")]
    skipped = sorted(Path(p).name for p in resolved.skipped)
    assert skipped == ["broken.json", "too-old.json", "unknown-field.json"]
    assert "below 0.5.0" in resolved.skipped[str(run / "too-old.json")]


def test_the_same_name_in_two_files_of_different_directories_is_no_conflict() -> None:
    data = json.dumps(spec("gpu", "0")).encode()
    resolved = resolve([("a", "a/x.json", data, ""), ("b", "b/x.json", data, "")])
    assert resolved.names == {gpu("0"): "b/x.json"} and resolved.conflicts == {}


def t4_config(**env: str) -> Config:
    return load_config(None, {"DEVICE_LIST_STRATEGY": "cdi-cri", **env}, {})


@pytest.fixture
def t4(tmp_path: Path, nvml_library: Path) -> NodeSim:
    return NodeSim("t4", tmp_path / "state")


def names_check(config: Config, node: NodeSim, dirs: tuple[Path, ...], env: dict[str, str] | None = None
                ) -> Finding:
    checks = CdiChecks()
    checks.where = Where(env=env or {}, context="container", cdi_dirs=dirs)
    checks.config, checks.config_valid = config, True
    checks.plan = plan(config, node.inventory)
    return checks.cdi_names()


def test_names_of_the_plan_resolve_or_the_missing_ones_are_listed(tmp_path: Path, t4: NodeSim) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    config = t4_config()
    failed = names_check(config, t4, (etc, run))
    assert failed.status == "FAIL"
    assert f"1 of 1 name(s) resolve in no spec in {etc} and {run}: {gpu(T4_UUID)}" in failed.detail
    assert "CDI spec written" in failed.fix and "nvdp cdi generate" in failed.fix
    put(run, f"{VENDOR}-gpu.json", spec("gpu", T4_UUID, "all"))
    assert names_check(config, t4, (etc, run)).status == "PASS"
    # deviceIDStrategy index: the plugin returns gpu=0, which this spec does not define.
    indexed = names_check(t4_config(DEVICE_ID_STRATEGY="index"), t4, (etc, run))
    assert indexed.status == "FAIL" and gpu("0") in indexed.detail


def test_a_conflict_with_another_file_is_named_with_the_fix(tmp_path: Path, t4: NodeSim) -> None:
    run = tmp_path / "run"
    put(run, f"{VENDOR}-gpu.json", spec("gpu", T4_UUID, "all"))
    other = put(run, "nvidia.json", spec("gpu", T4_UUID))
    finding = names_check(t4_config(), t4, (tmp_path / "etc", run))
    assert finding.status == "FAIL"
    assert "defined twice in one directory" in finding.detail and str(other) in finding.detail
    assert finding.fix.startswith("remove the other file")


def test_nvdp_cdi_dir_replaces_the_dynamic_directory(tmp_path: Path, t4: NodeSim) -> None:
    moved = tmp_path / "moved"
    put(moved, f"{VENDOR}-gpu.json", spec("gpu", T4_UUID))
    dirs = (tmp_path / "etc", tmp_path / "run")
    finding = names_check(t4_config(), t4, dirs, env={"NVDP_CDI_DIR": str(moved)})
    assert finding.status == "PASS" and str(moved) in finding.detail


def test_optional_classes_are_checked_when_their_spec_exists(tmp_path: Path, t4: NodeSim) -> None:
    config = replace(t4_config(GDS_ENABLED="true"), imex=replace(t4_config().imex, channel_ids=(0,)))
    inventory_plan = plan(config, t4.inventory)
    assert planned_names(config, inventory_plan, frozenset()) == [gpu(T4_UUID)]
    assert planned_names(config, inventory_plan, frozenset({"gds", "imex-channel"})) == [
        gpu(T4_UUID), f"{VENDOR}/imex-channel=0", f"{VENDOR}/gds=all"]
    run = tmp_path / "run"
    put(run, f"{VENDOR}-gpu.json", spec("gpu", T4_UUID))
    assert names_check(config, t4, (run,)).status == "PASS"  # no gds spec: the plugin names none
    put(run, f"{VENDOR}-imex-channel.json", spec("imex-channel", "1"))  # channel 0 missing from it
    finding = names_check(config, t4, (run,))
    assert finding.status == "FAIL" and f"{VENDOR}/imex-channel=0" in finding.detail


def hook_check(config: Config, env: dict[str, str]) -> Finding:
    checks = CdiChecks()
    checks.where = Where(env=env, context="container")
    checks.config, checks.config_valid = config, True
    return checks.cdi_hook()


def test_hook_is_looked_for_as_the_plugin_looks_for_it(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    config = t4_config(NVIDIA_CDI_HOOK_PATH="/usr/local/nvidia/toolkit/nvidia-cdi-hook",
                       DRIVER_ROOT_CTR_PATH=str(tmp_path / "no-driver-root"))
    missing = hook_check(config, {"NVDP_HOST_HOOK_DIR": str(hooks)})
    assert missing.status == "FAIL"
    assert str(hooks / "nvidia-cdi-hook") in missing.detail and "does not exist" in missing.detail
    assert "cdi.nvidiaHookPath" in missing.fix and "--cdi-disable-hooks=all" in missing.fix
    hook = hooks / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    assert hook_check(config, {"NVDP_HOST_HOOK_DIR": str(hooks)}).status == "PASS"
    no_hooks = t4_config(CDI_DISABLE_HOOKS="all", NVIDIA_CDI_HOOK_PATH="/nowhere/nvidia-cdi-hook")
    assert hook_check(no_hooks, {}).status == "PASS"


def test_the_doctor_adds_cdi_lines_only_with_a_cdi_strategy(tmp_path: Path, t4: NodeSim,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in t4.env.items():
        monkeypatch.setenv(key, value)
    where = Where(env=dict(os.environ), context="container", sysfs=t4.sysfs,
                  cdi_dirs=(tmp_path / "etc", tmp_path / "run"), timeout=5)
    plain = [f.check for f in Doctor(where, load_config(None, {}, {}), None).run()]
    assert "cdi" not in plain and "cdi-hook" not in plain
    checks = [f.check for f in Doctor(where, t4_config(), None).run()]
    assert checks[checks.index("config") + 1:checks.index("config") + 3] == ["cdi", "cdi-hook"]
