"""Where MPS state lives, shared by the daemon container and the plugin container.

Both containers mount the host's MPS root (`flags.mpsRoot`, chart value `mps.root`) at `/mps`
(override with env `MPS_CONTAINER_ROOT`, used by tests and local demos). Inside it:

    <root>/shm/                     tmpfs that MPS clients share as /dev/shm (`mps-control-daemon mount-shm`)
    <root>/<resource>/pipe/         CUDA_MPS_PIPE_DIRECTORY: the daemon's `control` socket and pid file
    <root>/<resource>/log/          CUDA_MPS_LOG_DIRECTORY: control.log, server.log
    <root>/<resource>/.ready        present only while that resource's daemon answers commands
    <root>/<resource>/status.json   the daemon's state and last error, for the plugin's messages

`<resource>` is the full resource name, so `nvidia.com/gpu` gives `/mps/nvidia.com/gpu/pipe`, the same
paths NVIDIA's plugin uses (workload containers get the pipe directory at that path too).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from msgspec import Struct

DEFAULT_CONTAINER_ROOT = "/mps"
CONTAINER_ROOT_ENV = "MPS_CONTAINER_ROOT"
# flags.mpsRoot as the chart passes it: the path on the node, for messages.
HOST_ROOT_ENV = "MPS_ROOT"
READY_MARKER = ".ready"
STATUS_FILE = "status.json"
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


def describe_root(root: Path, host_root: str | None = None) -> str:
    """`/mps (host path /run/nvidia/mps)`: the container's view and the node's, when they differ."""
    host = os.environ.get(HOST_ROOT_ENV, "") if host_root is None else host_root
    return f"{root} (host path {host})" if host and host != str(root) else str(root)


def unusable_root_message(root: Path, problem: str, host_root: str | None = None) -> str:
    return (
        f"the MPS root {describe_root(root, host_root)} is unusable: {problem}; fix: make it a writable "
        "directory on the node (move away the file in the way, or remount it read-write), or set "
        "flags.mpsRoot (chart value mps.root) to another directory"
    )


def shm_dir(root: Path) -> Path:
    return root / "shm"


class ResourcePaths(Struct, frozen=True):
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
    def status_file(self) -> Path:
        return self.base / STATUS_FILE

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


def unusable_root(root: Path, base: Path | None = None) -> str | None:
    """Why MPS state cannot live under `root` (and `base` below it), or None.

    A missing directory is no problem (the daemon creates it); a regular file in the way, or a
    read-only filesystem, is: nothing can make the daemon's directories or remove a stale marker.
    """
    chain = [*reversed(root.parents), root]
    if base is not None and base.is_relative_to(root):
        for part in base.relative_to(root).parts:
            chain.append(chain[-1] / part)
    deepest: Path | None = None
    for path in chain:
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            break
        except OSError as err:
            return f"{path} cannot be used: {err.strerror or err}"
        if not stat.S_ISDIR(mode):
            return f"{path} is a file, not a directory"
        deepest = path
    if deepest is not None and deepest != Path(deepest.anchor) and deepest.is_relative_to(root):
        try:
            read_only = bool(os.statvfs(deepest).f_flag & os.ST_RDONLY)
        except OSError as err:
            return f"{deepest} cannot be used: {err.strerror or err}"
        if read_only:
            return f"{deepest} is on a read-only filesystem"
    return None
