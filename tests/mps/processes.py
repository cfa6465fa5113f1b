"""Start the MPS daemon and the plugin as real processes on a simulated T4 node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sim.mps import BIN_DIR, RECORD_ENV
from sim.nvml import NodeSim

from .waiting import wait_for

SEED_CONFIG = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


class Proc:
    """A child process whose combined output goes to a file the test reads."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("w")
        self.popen = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text()

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        return self.popen.wait(timeout)

    def wait_output(self, text: str, count: int = 1) -> bool:
        return wait_for(lambda: self.output().count(text) >= count)

    def stop(self) -> None:
        if self.running():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


class MpsNode:
    """One simulated node: NVML stand-in, MPS root, kubelet directory and config file, all under `root`."""

    def __init__(self, root: Path, profile: str = "t4", replicas: int = 10) -> None:
        self.root = root
        self.mps_root = root / "mps"
        self.kubelet_dir = root / "kubelet"
        self.record = root / "record.jsonl"
        self.config = root / "config.yaml"
        self.write_config(replicas)
        self.node = NodeSim(profile, root / "nvml")
        self.procs: list[Proc] = []

    def write_config(self, replicas: int) -> None:
        self.config.write_text(SEED_CONFIG.format(replicas=replicas))

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.node.env,
            "PATH": f"{BIN_DIR}:{os.environ['PATH']}",
            "MPS_ROOT": str(self.mps_root),  # flags.mpsRoot: the host path
            "MPS_CONTAINER_ROOT": str(self.mps_root),  # where both containers see it
            RECORD_ENV: str(self.record),
            "MPS_PROBE_INTERVAL": "0.1",
            "MPS_WAIT_LOG_INTERVAL": "0.3",
            "NODE_NAME": "gpu-node",
            "PYTHONUNBUFFERED": "1",
        }

    def daemon_argv(self) -> list[str]:
        return [sys.executable, "-m", "nvdp.mps.main", "--config-file", str(self.config)]

    def start_daemon(self) -> Proc:
        return self._start("daemon", self.daemon_argv())

    def start_plugin(self) -> Proc:
        argv = [
            sys.executable,
            "-m",
            "nvdp.plugin.main",
            "--config-file",
            str(self.config),
            "--device-plugin-path",
            str(self.kubelet_dir),
        ]
        return self._start("plugin", argv)

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, {**self.env, **(env or {})}, self.root / f"{name}-{len(self.procs)}.log")
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
