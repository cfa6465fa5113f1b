"""Stand-in `nvidia-cuda-mps-control` (an executable script in this directory) and test helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BIN_DIR = Path(__file__).resolve().parent
CONTROL = BIN_DIR / "nvidia-cuda-mps-control"
RECORD_ENV = "MPS_SIM_RECORD"
# Beside control.log in the daemon's log folder: every limit it was set to, whatever its environment.
LIMITS_SET = "limits-set.jsonl"


def read_record(path: Path) -> list[dict[str, Any]]:
    """The events the stand-in daemon appended to its record file (empty if none yet)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded_commands(path: Path) -> list[str]:
    return [e["command"] for e in read_record(path) if e["event"] == "command"]


def recorded_servers(path: Path) -> list[dict[str, Any]]:
    """Each MPS server the stand-in started, and each change of a running server's ceilings, in order."""
    return [e for e in read_record(path) if e["event"] == "server"]


def limits_set(log_dir: Path) -> list[dict[str, Any]]:
    """Every limit the stand-in daemon logging to `log_dir` was set to, in order (a default's `server` is
    None): `{"scope": "default", "server": None, "limit": "active_thread_percentage", "device": None,
    "value": "25.0", "pid": ...}`."""
    return read_record(log_dir / LIMITS_SET)


def connect_client(pipe_dir: Path, client_env: dict[str, str]) -> dict[str, Any]:
    """Play an MPS client with the CUDA_MPS_* variables `client_env` connecting to the stand-in daemon
    at `pipe_dir`: its limits as the daemon's server holds it to them (a server is started for the first
    client, with the defaults as its ceilings)."""
    import os
    import subprocess

    args = " ".join(f"{k}={v}" for k, v in sorted(client_env.items()) if k.startswith("CUDA_MPS_"))
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    done = subprocess.run([str(CONTROL)], input=f"sim_client {args}\n", env=env, capture_output=True,
                          text=True, timeout=10, check=True)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
