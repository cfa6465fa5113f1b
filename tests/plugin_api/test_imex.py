"""IMEX channels at start: found as NVIDIA v0.20.0 finds them, required ones stop the plugin with the fix,
missing ones are never handed out."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from grpc_factories import config_with, gpu_uuid, make_inventory, whole_gpu_resource
from msgspec.structs import replace

from nvdp.config.model import Config, Imex
from nvdp.daemon.errors import StartupError
from nvdp.daemon.imex import ChannelCheck, channels_on_node, check_channels, is_char_device
from nvdp.plugin.allocate import allocate_container

CHANNEL0 = "/dev/nvidia-caps-imex-channels/channel0"


def imex_config(required: bool = False, driver_root: str = "/driver-root", **plugin: object) -> Config:
    config = config_with(container_driver_root=driver_root, **plugin)
    return replace(config, imex=Imex(channel_ids=(0,), required=required))


def check(
    config: Config, char_devices: set[str], dirs: frozenset[str] = frozenset({"/driver-root/dev"})
) -> ChannelCheck:
    return check_channels(config, is_char_device=char_devices.__contains__, is_dir=dirs.__contains__)


def test_a_channel_is_found_under_the_driver_roots_dev_or_at_its_own_path() -> None:
    assert check(imex_config(), {"/driver-root" + CHANNEL0}) == ChannelCheck(present=(0,))
    assert check(imex_config(), {CHANNEL0}) == ChannelCheck(present=(0,))
    # No /dev under the driver root: NVIDIA's dev root is then /, and the driver root is not searched.
    assert check(imex_config(), {"/driver-root" + CHANNEL0}, dirs=frozenset()).present == ()


def test_a_missing_channel_is_left_out_when_not_required() -> None:
    result = check(imex_config(), set())
    assert result.present == () and result.problem is None
    assert result.ignored == (f"channel0 (no character device at /driver-root{CHANNEL0} and {CHANNEL0})",)


def test_a_missing_required_channel_is_a_problem_naming_the_path_and_the_fix() -> None:
    result = check(imex_config(required=True), set())
    assert result.problem is not None
    assert "requested IMEX channel channel0 does not exist" in result.problem  # NVIDIA's words
    assert f"/driver-root{CHANNEL0} and {CHANNEL0}" in result.problem
    assert "unset imex.required" in result.problem
    assert check(imex_config(required=True), {CHANNEL0}) == ChannelCheck(present=(0,))


def test_only_a_character_device_counts(tmp_path: Path) -> None:
    regular = tmp_path / "channel0"
    regular.touch()
    assert not is_char_device(str(regular))
    assert not is_char_device(str(tmp_path / "missing"))
    assert is_char_device("/dev/null")


def test_no_channels_configured_checks_nothing() -> None:
    config = config_with()
    assert channels_on_node(config) is config


def test_required_channel_missing_on_the_node_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    where = rf"no character device at {tmp_path}{CHANNEL0}"
    with pytest.raises(StartupError, match=rf"channel0 does not exist \({where}"):
        channels_on_node(imex_config(required=True, driver_root=str(tmp_path)))


def test_a_channel_missing_on_the_node_is_never_handed_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "dev").mkdir()
    config = imex_config(
        driver_root=str(tmp_path),
        device_list_strategy=("envvar", "volume-mounts", "cdi-cri"),
        pass_device_specs=True,
    )
    with caplog.at_level(logging.WARNING):
        prepared = channels_on_node(config, logging.getLogger("test.imex"))
    assert prepared.imex.channel_ids == ()
    assert "Ignoring requested IMEX channel channel0" in caplog.text
    result = allocate_container(
        whole_gpu_resource(make_inventory(1)),
        [gpu_uuid(0)],
        prepared,
        dev_paths_present=lambda _path: False,
        mig_cap_minors=None,
        cdi_uuid=lambda: "0",
        cdi_classes=frozenset(),
    )
    assert "NVIDIA_IMEX_CHANNELS" not in result.envs
    assert not any("imex" in m.container_path for m in result.mounts)
    assert not any("imex" in d.container_path for d in result.devices)
    assert not any("imex-channel" in name for name in result.cdi_devices)
