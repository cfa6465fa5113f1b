"""`nvdp cdi generate` loads its settings as the device plugin does: the plugin's CDI flags, and on a
host (no container driver root) the driver root as the place its files are read."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nvdp.cdi import cli
from nvdp.config.model import Config
from nvdp.daemon.inputs import load_config as plugin_load_config
from nvdp.plugin.main import build_parser as plugin_parser


def cli_load(*argv: str) -> tuple[Config, str | None]:
    parser = argparse.ArgumentParser(prog="nvdp")
    cli.register(parser.add_subparsers())
    return cli.load(parser.parse_args(["cdi", "generate", *argv]), {})


def cli_config(*argv: str) -> Config:
    return cli_load(*argv)[0]


def plugin_config(*argv: str) -> Config:
    return plugin_load_config(plugin_parser({}).parse_args(list(argv)), {}, None, per_node=False)


def test_the_plugins_cdi_flags_give_the_plugins_config(tmp_path: Path) -> None:
    settings = ["--driver-root", "/run/nvidia/driver", "--dev-root", "/", "--nvidia-cdi-hook-path",
                "/usr/local/nvidia/toolkit/nvidia-cdi-hook", "--cdi-disable-hooks", "enable-cuda-compat",
                "--cdi-feature-flags", "enable-explicit-driver-libraries"]
    config = cli_config(*settings, "--container-driver-root", str(tmp_path))
    assert config == plugin_config(*settings, "--container-driver-root", str(tmp_path))
    plugin = config.flags.plugin
    assert plugin.container_driver_root == str(tmp_path)
    assert plugin.nvidia_ctk_path == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    assert plugin.cdi_disable_hooks == ("enable-cuda-compat",)
    assert plugin.cdi_feature_flags == ("enable-explicit-driver-libraries",)
    # NVIDIA's other names of the same flags
    assert cli_config("--nvidia-ctk-path", "/x/nvidia-ctk", "--driver-root-ctr-path", str(tmp_path)) == \
        plugin_config("--nvidia-ctk-path", "/x/nvidia-ctk", "--driver-root-ctr-path", str(tmp_path))


def test_on_a_host_the_driver_root_is_where_the_files_are_read(tmp_path: Path) -> None:
    assert not Path("/driver-root").exists()
    config = cli_config("--driver-root", str(tmp_path))
    assert config.flags.nvidia_driver_root == str(tmp_path)
    assert config.flags.plugin.container_driver_root == str(tmp_path)
    assert config == plugin_config("--driver-root", str(tmp_path), "--container-driver-root", str(tmp_path))


def test_on_a_host_the_device_nodes_are_read_under_the_dev_root(tmp_path: Path) -> None:
    """As nvidia-ctk reads them: under --dev-root when given (else by the plugin's rule: the driver
    root's dev/, else /); in the plugin's pod always by the plugin's rule."""
    assert cli_load("--driver-root", str(tmp_path), "--dev-root", "/host-dev")[1] == "/host-dev"
    assert cli_load("--driver-root", str(tmp_path))[1] is None
    mount = tmp_path / "driver-root"
    mount.mkdir()
    assert cli_load("--driver-root", "/run/nvidia/driver", "--container-driver-root", str(mount),
                    "--dev-root", "/host-dev")[1] is None


def test_a_container_driver_root_that_exists_applies_as_in_the_plugin_pod(tmp_path: Path) -> None:
    mount = tmp_path / "driver-root"
    mount.mkdir()
    config = cli_config("--driver-root", "/run/nvidia/driver", "--container-driver-root", str(mount))
    assert config.flags.plugin.container_driver_root == str(mount)
    assert config.flags.nvidia_driver_root == "/run/nvidia/driver"


def test_a_driver_root_that_is_not_here_leaves_the_container_driver_root() -> None:
    """In a pod without the mount the container runtime brings the driver to / (nvdp.cdi.host)."""
    config = cli_config("--driver-root", "/run/nvidia/driver-not-here")
    assert config.flags.plugin.container_driver_root == "/driver-root"


@pytest.mark.parametrize("flag", ["--driver-root", "--dev-root", "--container-driver-root"])
def test_a_relative_path_is_a_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="nvdp")
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["cdi", "generate", flag, "run/nvidia/driver"])
    assert cli.generate_command(args) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"nvdp cdi generate: error: {flag}: 'run/nvidia/driver' is not an absolute path; a path " \
                  "such as / or /run/nvidia/driver\n"
