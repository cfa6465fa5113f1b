"""Run the unmodified plugin process against the stand-in NVML and an in-process kubelet simulator."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdp.config.sources import CONFIG_FILE_ENV, ENV_VARS
from sim.kubelet import KubeletSim
from sim.nvml import NodeSim, build_library

POLL_S = 0.02


class PluginProcess:
    """`python -m nvdp.plugin.main` with its log in a file, so tests can wait for lines."""

    def __init__(self, plugin_dir: Path, log_path: Path, env: dict[str, str]) -> None:
        self.plugin_dir = plugin_dir
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str) -> PluginProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nvdp.plugin.main", *args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )
        return self

    @property
    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_for_log(self, text: str, timeout: float = 10.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while self.log.count(text) < count:
            if self.proc is not None and self.proc.poll() is not None:
                code = self.proc.returncode
                raise AssertionError(f"plugin exited ({code}) before logging {text!r}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"plugin did not log {text!r} (x{count}) within {timeout}s:\n{self.log}")
            time.sleep(POLL_S)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int:
        """SIGTERM; returns the exit status. Kills it when it does not stop in time."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def sockets(self) -> list[str]:
        return sorted(p.name for p in self.plugin_dir.glob("nvidia-*.sock"))


@pytest.fixture(scope="session")
def nvml_library() -> Path:
    return build_library()


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "device-plugins"
    path.mkdir()
    return path


def clean_env() -> dict[str, str]:
    """The test's environment without any setting the plugin would read as configuration."""
    return {k: v for k, v in os.environ.items() if k not in ENV_VARS and k != CONFIG_FILE_ENV}


MakePlugin = Callable[..., tuple[PluginProcess, NodeSim]]
MakeBarePlugin = Callable[..., PluginProcess]


@pytest.fixture
def _plugins() -> Iterator[list[PluginProcess]]:
    started: list[PluginProcess] = []
    yield started
    for plugin in started:
        if plugin.proc is not None and plugin.proc.poll() is None:
            plugin.proc.kill()
            plugin.proc.wait()


@pytest.fixture
def make_bare_plugin(tmp_path: Path, plugin_dir: Path, _plugins: list[PluginProcess]) -> MakeBarePlugin:
    """A plugin process whose environment points at no NVML at all."""

    def make(**env: str) -> PluginProcess:
        full = {**clean_env(), "DEVICE_PLUGIN_PATH": str(plugin_dir), **env}
        plugin = PluginProcess(plugin_dir, tmp_path / f"plugin-{len(_plugins)}.log", full)
        _plugins.append(plugin)
        return plugin

    return make


@pytest.fixture
def make_plugin(tmp_path: Path, nvml_library: Path, make_bare_plugin: MakeBarePlugin) -> MakePlugin:
    """A plugin process on a simulated node (sim/profiles/<profile>.yaml) with extra environment."""

    def make(profile: str = "t4", **env: str) -> tuple[PluginProcess, NodeSim]:
        node = NodeSim(profile, tmp_path / "state")
        return make_bare_plugin(**node.env, **env), node

    return make


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletSim]:
    with KubeletSim(plugin_dir) as sim:
        yield sim


@pytest.fixture
def sockets() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="nvdp-dra-", dir="/tmp"))  # unix socket paths stay short
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
