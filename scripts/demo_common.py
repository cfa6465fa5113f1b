"""What both demos (scripts/demo.py, scripts/demo_dra.py) share: the checkout on sys.path, the environment
the daemons start from, waiting for a daemon's log line, the header and the closing section."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (str(ROOT / "src"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from nvdp.config.names import DEFAULT_MODE_ENV, DRA_DRIVER_ENV, NODE_NAME_ENV  # noqa: E402
from nvdp.config.sources import CONFIG_FILE_ENV, ENV_VARS  # noqa: E402
from nvdp.daemon.report.observe import METRICS_ADDRESS_ENV  # noqa: E402

# Settings of this shell a daemon would read besides the config's own (ENV_VARS): the demo starts every
# daemon from the config it is given and the folders it makes, nothing else.
OTHER_SETTINGS = (NODE_NAME_ENV, "KUBECONFIG", DEFAULT_MODE_ENV, DRA_DRIVER_ENV, "CONFIG_DIR",
                  "MPS_CONTAINER_ROOT", METRICS_ADDRESS_ENV)
POLL_S = 0.05


class DemoError(Exception):
    """The demo cannot go on; the message says what happened (and the daemon's log where there is one)."""


class Refused(DemoError):
    """The arguments ask for something the demo cannot do here; said before anything starts (exit 2)."""


def daemon_env(config: str | None, *layers: dict[str, str]) -> dict[str, str]:
    """This shell's environment without nvdp settings, with the checkout's nvdp, `config` as the config
    file (None: the built-in defaults) and `layers` on top."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and k not in OTHER_SETTINGS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    if config:
        env[CONFIG_FILE_ENV] = str(Path(config).resolve())
    for layer in layers:
        env.update(layer)
    return env


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], what: str,
                  timeout: float) -> None:
    """Until `text` is in the log of `process`; DemoError with the log when it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None:
            raise DemoError(f"{what} exited with status {process.returncode}. Its log:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise DemoError(f"{what} did not log {text!r} within {timeout:g}s. Its log:\n{log.read_text()}")
        time.sleep(POLL_S)


def header(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """The demo's first lines: what it started, each part real or simulated."""
    print(title)
    width = max(len(key) for key, _ in rows) + 1
    for key, value in rows:
        print(f"  {(key + ':') if key else '':<{width}} {value}")


def section(title: str) -> None:
    print(f"\n== {title}")


def show_log(title: str, log: Path) -> None:
    """A daemon's log, indented."""
    section(title)
    for line in log.read_text(errors="replace").splitlines():
        print(f"  {line}")


def next_steps(steps: Sequence[tuple[str, str]]) -> None:
    section("Next steps")
    width = max(len(what) for what, _ in steps)
    for what, how in steps:
        print(f"  {what.ljust(width)}  {how}")
