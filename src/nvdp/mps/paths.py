"""Where MPS state lives, shared by the daemon container and the plugin container.

Both containers mount the host's MPS root (`flags.mpsRoot`, chart value `mps.root`) at `/mps`
(override with env `MPS_CONTAINER_ROOT`, used by tests and local demos). Inside it:

    <root>/shm/                     tmpfs that MPS clients share as /dev/shm (`mps-control-daemon mount-shm`)
    <root>/<resource>/pipe/         CUDA_MPS_PIPE_DIRECTORY: the daemon's `control` socket and pid file
    <root>/<resource>/log/          CUDA_MPS_LOG_DIRECTORY: control.log, server.log
    <root>/<resource>/.ready        present only while that resource's daemon answers commands

`<resource>` is the full resource name, so `nvidia.com/gpu` gives `/mps/nvidia.com/gpu/pipe`, the same
paths NVIDIA's plugin uses (workload containers get the pipe directory at that path too).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONTAINER_ROOT = "/mps"
CONTAINER_ROOT_ENV = "MPS_CONTAINER_ROOT"
READY_MARKER = ".ready"
# Written by nvidia-cuda-mps-control -d into the pipe directory.
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_LOG = "control.log"
CONTROL_SOCKET = "control"
# sun_path holds 108 bytes including the terminating NUL.
SOCKET_PATH_MAX = 107


def container_root(env: Mapping[str, str] | None = None) -> Path:
    """The MPS root as this container sees it."""
    source = os.environ if env is None else env
    return Path(source.get(CONTAINER_ROOT_ENV) or DEFAULT_CONTAINER_ROOT)


def shm_dir(root: Path) -> Path:
    return root / "shm"


@dataclass(frozen=True)
class ResourcePaths:
    root: Path
    resource_name: str  # "nvidia.com/gpu"

    def __post_init__(self) -> None:
        parts = self.resource_name.split("/")
        if not self.resource_name or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"resource name {self.resource_name!r} cannot be used as an MPS directory name")

    @property
    def base(self) -> Path:
        return self.root / self.resource_name

    @property
    def pipe_dir(self) -> Path:
        return self.base / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    @property
    def ready_marker(self) -> Path:
        return self.base / READY_MARKER

    @property
    def pid_file(self) -> Path:
        return self.pipe_dir / PID_FILE

    @property
    def control_socket(self) -> Path:
        return self.pipe_dir / CONTROL_SOCKET

    def socket_path_problem(self) -> str | None:
        """Why MPS could not create its control socket here, if the path is too long for one."""
        length = len(str(self.control_socket).encode())
        if length <= SOCKET_PATH_MAX:
            return None
        return (
            f"the MPS control socket path {self.control_socket} is {length} bytes, more than the "
            f"{SOCKET_PATH_MAX} a unix socket allows; use a shorter MPS root"
        )

    @property
    def control_log(self) -> Path:
        return self.log_dir / CONTROL_LOG
