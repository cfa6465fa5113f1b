"""Demo: the real plugin process on a simulated node, seen through a simulated kubelet.

Builds the stand-in NVML, starts the kubelet simulator in a temporary directory, starts
`python -m nvdp.plugin.main` against a node profile, prints what the kubelet sees (the
registration, the advertised count, one Allocate response) and stops everything.

    python scripts/demo.py [--profile t4] [--config my-config.yaml]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from nvdp.config.loader import ConfigError, load_config  # noqa: E402
from sim.kubelet import KubeletSim  # noqa: E402
from sim.mps import BIN_DIR as MPS_SIM_BIN  # noqa: E402
from sim.nvml import NodeSim  # noqa: E402
from sim.processes import running  # noqa: E402

CONFIG_VARIABLES = ("CONFIG_FILE", "DEVICE_PLUGIN_PATH", "KUBELET_SOCKET", "MPS_ROOT", "MPS_CONTAINER_ROOT")
TIMESTAMPS = ("time", "monotonic")


class DemoError(Exception):
    pass


def first_resource(kubelet: KubeletSim, timeout: float) -> str:
    try:
        return kubelet.wait_for_registration(timeout)
    except TimeoutError:
        raise DemoError(f"the plugin did not register with the kubelet within {timeout:g}s") from None


def run(profile: str, config: str | None, workdir: Path) -> None:
    node = NodeSim(profile, workdir / "state")
    plugin_dir = workdir / "device-plugins"
    env = {k: v for k, v in os.environ.items() if k not in CONFIG_VARIABLES}
    env.update(node.env)
    env["DEVICE_PLUGIN_PATH"] = str(plugin_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    if config:
        env["CONFIG_FILE"] = str(Path(config).resolve())
    log_path = workdir / "plugin.log"
    with KubeletSim(plugin_dir) as kubelet, open(log_path, "wb") as log, \
            mps_daemon(config, env, workdir) as daemon_log:
        plugin = subprocess.Popen([sys.executable, "-m", "nvdp.plugin.main"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            try:
                name = first_resource(kubelet, 15)
            except DemoError as err:
                if plugin.poll() is not None:
                    raise DemoError(f"the plugin exited with status {plugin.returncode}:\n"
                                    f"{log_path.read_text()}") from None
                raise DemoError(f"{err}. Its log:\n{log_path.read_text()}") from None
            devices = kubelet.wait_for_resource(name, timeout=10)
            print("Registration:")
            registration = {k: v for k, v in kubelet.registrations[0].items() if k not in TIMESTAMPS}
            print(json.dumps(registration, indent=2))
            print(f"\n{name}: {len(devices)} allocatable "
                  f"({sum(d['health'] == 'Healthy' for d in devices)} healthy)")
            response = kubelet.allocate(name, [[devices[0]["id"]]])
            print(f"\nAllocate {devices[0]['id']}:")
            print(json.dumps(response, indent=2))
        finally:
            if plugin.poll() is None:
                plugin.send_signal(signal.SIGTERM)
            try:
                status = plugin.wait(15)
            except subprocess.TimeoutExpired:
                plugin.kill()
                raise DemoError("the plugin did not stop within 15s of SIGTERM") from None
    if status != 0:
        raise DemoError(f"the plugin exited with status {status}:\n{log_path.read_text()}")
    print(f"\nPlugin stopped cleanly. Its log:\n{log_path.read_text()}")
    if daemon_log is not None:
        print(f"MPS control daemon log:\n{daemon_log.read_text()}")


@contextlib.contextmanager
def mps_daemon(config: str | None, env: dict[str, str], workdir: Path) -> Iterator[Path | None]:
    """For a config that shares GPUs with MPS, run the MPS control daemon beside the plugin, as the chart
    does, with the stand-in nvidia-cuda-mps-control; both see the MPS root in `workdir`."""
    if config is None or load_config(config, env={}).sharing.strategy != "mps":
        yield None
        return
    root = workdir / "mps"
    env.update(PATH=f"{MPS_SIM_BIN}{os.pathsep}{env.get('PATH', '')}", MPS_ROOT=str(root),
               MPS_CONTAINER_ROOT=str(root))
    log_path = workdir / "mps-daemon.log"
    with running([sys.executable, "-m", "nvdp.mps.main"], env, log_path):
        yield log_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", default="t4", help="node profile: a name from sim/profiles or a path")
    parser.add_argument("--config", help="plugin config file (default: built-in defaults)")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="nvdp-demo-") as workdir:
            run(args.profile, args.config, Path(workdir))
    except (DemoError, ConfigError, FileNotFoundError, TimeoutError, RuntimeError) as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
