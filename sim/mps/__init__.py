"""Stand-in `nvidia-cuda-mps-control` (an executable script in this directory) and test helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BIN_DIR = Path(__file__).resolve().parent
CONTROL = BIN_DIR / "nvidia-cuda-mps-control"
RECORD_ENV = "MPS_SIM_RECORD"


def read_record(path: Path) -> list[dict[str, Any]]:
    """The events the stand-in daemon appended to its record file (empty if none yet)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded_commands(path: Path) -> list[str]:
    return [e["command"] for e in read_record(path) if e["event"] == "command"]
