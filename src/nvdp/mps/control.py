"""Talking to `nvidia-cuda-mps-control`: start a daemon, send it commands, ask if it answers.

Both the MPS daemon container and the plugin container use this; the binary comes from the host
driver (the NVIDIA container runtime injects it), tests put a stand-in on PATH.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

CONTROL_BINARY = "nvidia-cuda-mps-control"
PROBE_COMMAND = "get_default_active_thread_percentage"
DEFAULT_TIMEOUT_S = 5.0


class MpsCommandError(RuntimeError):
    """nvidia-cuda-mps-control could not be run, or the daemon did not answer."""


def control_env(
    pipe_dir: Path,
    log_dir: Path | None = None,
    visible_devices: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for the daemon and its clients; other CUDA_* settings are dropped."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("CUDA_")}
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    if log_dir is not None:
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    return env


def _run(args: Sequence[str], env: Mapping[str, str], stdin: str, timeout_s: float) -> str:
    what = " ".join([CONTROL_BINARY, *args])
    try:
        done = subprocess.run(
            [CONTROL_BINARY, *args],
            input=stdin,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise MpsCommandError(
            f"{CONTROL_BINARY} is not on PATH ({env.get('PATH', '')}); it comes from the host driver: "
            "run the container with the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES including compute"
        ) from None
    except subprocess.TimeoutExpired:
        raise MpsCommandError(f"{what} did not finish within {timeout_s:g}s") from None
    except OSError as err:
        raise MpsCommandError(f"cannot run {what}: {err}") from None
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise MpsCommandError(f"{what} exited with status {done.returncode}: {detail}")
    return done.stdout


def start_daemon(env: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """`nvidia-cuda-mps-control -d`: returns once the background daemon is started."""
    _run(["-d"], env, "", timeout_s)


def send_commands(
    commands: Sequence[str], env: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> str:
    """Pipe `commands` to a client process, as NVIDIA documents (`echo quit | nvidia-cuda-mps-control`)."""
    return _run([], env, "".join(f"{c}\n" for c in commands), timeout_s)


def probe(pipe_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Raise MpsCommandError unless the daemon behind `pipe_dir` answers a harmless query."""
    answer = send_commands([PROBE_COMMAND], control_env(pipe_dir), timeout_s).strip()
    if not answer:
        raise MpsCommandError(f"the MPS daemon at {pipe_dir} gave no answer to {PROBE_COMMAND}")
