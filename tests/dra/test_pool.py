"""nvdp.dra.pool.contents: the devices of a node's pool, and a DRA plugin with nothing to publish says why at
WARNING, with the fix (the plugin's log and `nvdp dra slices` alike)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from msgspec.structs import replace

from nvdp.config.model import Config, Flags
from nvdp.daemon.pernode.mode import DEFAULT_MODE_ENV
from nvdp.dra.pool import contents as pool
from nvdp.inventory.profile import load_profile
from sim.nvml import PROFILES_DIR

from .test_cli import run

LOGGER = "test-dra-plugin"


def switch(tmp_path: Path, profile: str, env: dict[str, str], config: str | None,
           monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-dra-plugin puts its first config in force on the profile's GPUs (its `switch`, as at
    start; the CDI facts, which a profile does not describe, are not read)."""
    from nvdp.daemon.pernode.mode import ModeGate
    from nvdp.daemon.skeleton import Skeleton
    from nvdp.dra.main import build_parser
    from nvdp.dra.work import DraWork

    monkeypatch.setattr("nvdp.daemon.inputs.discover",
                        lambda _config: load_profile(PROFILES_DIR / f"{profile}.yaml"))
    monkeypatch.setattr("nvdp.cdi.host.discover_host", lambda *_a, **_k: SimpleNamespace(warnings=()))
    argv = ["--kubeconfig", str(tmp_path / "no-kubeconfig")]
    if config is not None:
        path = tmp_path / "config.yaml"
        path.write_text(config)
        argv += ["--config-file", str(path)]
    env = {"NODE_NAME": "node-1", **env}
    log = logging.getLogger(LOGGER)
    skeleton = Skeleton("nvidia-dra-plugin", log, env)
    skeleton.gate = ModeGate("dra", None, skeleton.report, log, per_node=False)
    DraWork(skeleton, build_parser(env).parse_args(argv)).switch(None)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_the_default_mode_outside_the_chart_is_a_warning_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    switch(tmp_path, "t4", {}, None, monkeypatch)
    (warning,) = warnings(caplog)
    assert warning.startswith("This node is in device-plugin mode (NVDP_DEFAULT_MODE is unset; no "
                              "flags.mode in the built-in defaults)")
    assert "the DRA plugin publishes no ResourceSlices" in warning
    assert "set NVDP_DEFAULT_MODE=dra (chart value dra.defaultMode), or flags.mode: dra" in warning


def test_a_config_in_device_plugin_mode_names_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    switch(tmp_path, "t4", {DEFAULT_MODE_ENV: "dra"}, "version: v1\nflags:\n  mode: device-plugin\n",
           monkeypatch)
    (warning,) = warnings(caplog)
    assert f"({tmp_path / 'config.yaml'} sets flags.mode: device-plugin)" in warning
    assert warning.endswith("to publish them set flags.mode: dra in that config")


def test_a_mig_gpu_without_mig_devices_is_a_warning_per_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    switch(tmp_path, "h100-mig-empty", {DEFAULT_MODE_ENV: "dra"}, None, monkeypatch)
    (warning,) = warnings(caplog)
    assert warning.startswith("GPU 0 (GPU-14a86516-72e7-42d0-8146-f5b66dd2994f) has MIG mode enabled "
                              "and no MIG devices: the DRA plugin publishes no device for it")
    assert "nvidia-smi -i 0 -mig 0" in warning
    assert "Devices: gpu-1" in caplog.messages  # the GPU with MIG off is published


def test_a_node_in_dra_mode_with_devices_has_no_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    switch(tmp_path, "h100-mig-8", {DEFAULT_MODE_ENV: "dra"}, None, monkeypatch)
    assert warnings(caplog) == []


def test_the_preview_warns_as_the_plugin_with_its_own_flag() -> None:
    code, out, err = run("--node", "t4", "--default-mode", "device-plugin")
    assert code == 0 and out == "[]\n"
    assert err.startswith("nvdp dra slices: warning: This node is in device-plugin mode (--default-mode "
                          "device-plugin; no flags.mode in the built-in defaults)")
    assert "set --default-mode dra (the chart's dra.defaultMode), or flags.mode: dra" in err
    code, out, err = run("--node", "h100-mig-empty")
    assert code == 0 and [d["name"] for d in json.loads(out)[0]["spec"]["devices"]] == ["gpu-1"]
    assert err.count("\n") == 1 and "GPU 0 (GPU-14a86516" in err and "has MIG mode enabled" in err


def test_a_node_without_gpus_says_its_pool_is_empty() -> None:
    t4 = load_profile(PROFILES_DIR / "t4.yaml")
    (warning,) = pool.pool_warnings(Config(flags=Flags()), replace(t4, gpus=()), "dra",
                                    default_is="", default_fix="")
    assert warning.startswith("This node has no GPUs")
