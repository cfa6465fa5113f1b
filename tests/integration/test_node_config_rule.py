"""The per-node config rule, one table, run against every daemon.

The device plugin, the DRA kubelet plugin, the MPS control daemon and GPU feature discovery each run
unmodified on the stand-in NVML with a directory of config entries and a real kube-apiserver whose
Node label picks the entry. They
must behave alike: an invalid labelled entry at start falls back to the default (no exit), an
unknown or invalid entry later keeps the running one, a fixed entry is taken up, an edit of the
chosen entry and SIGHUP reload it, and removing the label goes back to the default.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.nvml import NodeSim
from tests.kube.envtest import ControlPlane

from .cdi_node import make_cdi_node
from .conftest import clean_env
from .scrape import free_port, scrape
from .test_node_config import entries_dir, update_entries

pytestmark = pytest.mark.slow
LABEL = "nvidia.com/device-plugin.config"
PLAIN = "version: v1\n"
SHARED = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n"
          "        replicas: {}\n")
ENTRIES = {"plain": PLAIN, "ts": SHARED.format(4), "broken": SHARED.format(0)}
DAEMONS = ("nvidia-device-plugin", "nvidia-dra-plugin", "mps-control-daemon", "gpu-feature-discovery")


class Daemon:
    """One daemon process with its log in a file, so steps can wait for lines."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, text: str, count: int = 1, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.log.count(text) < count:
            assert self.proc.poll() is None, f"exited ({self.proc.returncode}) before {text!r}:\n{self.log}"
            assert time.monotonic() < deadline, f"no {text!r} (x{count}) within {timeout}s:\n{self.log}"
            time.sleep(0.05)

    def in_force(self) -> str:
        lines = [line for line in self.log.splitlines() if "Config in force: " in line]
        return lines[-1].split("Config in force: ", 1)[1] if lines else ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start(kind: str, tmp_path: Path, env: dict[str, str], node: NodeSim, sockets: Path) -> Daemon:
    log = tmp_path / f"{kind}.log"
    if kind == "nvidia-dra-plugin":
        # Its claims' CDI specs need the driver's files; the kubelet folders hold unix sockets, whose
        # paths must stay short (`sockets`).
        cdi = make_cdi_node(tmp_path / "cdi-node", node.inventory)
        return Daemon([sys.executable, "-m", "nvdp.dra.main"],
                      {**env, **cdi.env, "CDI_ROOT": str(cdi.cdi_dir),
                       "KUBELET_PLUGINS_DIR": str(sockets / "plugins"),
                       "KUBELET_REGISTRAR_DIR": str(sockets / "registry")}, log)
    if kind == "nvidia-device-plugin":
        plugin_dir = tmp_path / "device-plugins"
        plugin_dir.mkdir()
        return Daemon([sys.executable, "-m", "nvdp.plugin.main"],
                      {**env, "DEVICE_PLUGIN_PATH": str(plugin_dir),
                       "METRICS_ADDRESS": f"127.0.0.1:{env['TEST_METRICS_PORT']}"}, log)
    if kind == "mps-control-daemon":
        from sim.mps import BIN_DIR

        root = tmp_path / "mps"
        root.mkdir()
        return Daemon([sys.executable, "-m", "nvdp.mps.main"],
                      {**env, "PATH": f"{BIN_DIR}:{os.environ['PATH']}", "MPS_ROOT": str(root),
                       "MPS_CONTAINER_ROOT": str(root), "MPS_PROBE_INTERVAL": "0.1"}, log)
    return Daemon([sys.executable, "-m", "nvdp.gfd.main", "--use-node-feature-api=false",
                   "-o", str(tmp_path / "features"), "--sleep-interval", "1h"], env, log)


@pytest.fixture(params=DAEMONS)
def daemon_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sockets() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="nvdp-rule-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeSim]:
    with NodeSim("t4", tmp_path / "nvml") as sim:
        yield sim


def test_the_per_node_config_rule(daemon_kind: str, node: NodeSim, kube_api: ControlPlane,
                                  tmp_path: Path, sockets: Path) -> None:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(name, labels={LABEL: "broken"})
    root = entries_dir(tmp_path, ENTRIES)
    env = {**clean_env(), **node.env, "CONFIG_DIR": str(root), "DEFAULT_CONFIG": "plain", "NODE_NAME": name,
           "KUBECONFIG": str(kube_api.admin_kubeconfig), "PYTHONUNBUFFERED": "1",
           "TEST_METRICS_PORT": str(free_port())}
    daemon = start(daemon_kind, tmp_path, env, node, sockets)

    def metric_names(entry: str) -> None:
        """The device plugin's nvdp_config_active names the entry in force (the others have no such
        series)."""
        if daemon_kind == "nvidia-device-plugin":
            samples = scrape(int(env["TEST_METRICS_PORT"]))
            active = {dict(labels)["entry"] for (name, labels), v in samples.items()
                      if name == "nvdp_config_active" and v == 1}
            assert active == {entry}, samples

    def label(value: str | None) -> None:
        kube_api.kubectl("label", "node", name, f"{LABEL}={value}" if value else f"{LABEL}-", "--overwrite")

    try:
        # At start, the labelled entry is invalid: the daemon starts on the default instead of exiting.
        daemon.wait_for("Config in force: ")
        metric_names("plain")
        assert daemon.in_force() == "entry 'plain' (from config.default)"
        assert "InvalidConfig: config entry 'broken' chosen by the node label is invalid" in daemon.log

        # An unknown entry: reported, the running one stays.
        label("nope")
        daemon.wait_for("names config 'nope', which does not exist")
        assert daemon.in_force() == "entry 'plain' (from config.default)"

        # A valid entry is taken up.
        label("ts")
        daemon.wait_for("Config in force: entry 'ts' (from label)")
        metric_names("ts")

        # An invalid one later: reported, the running one stays, the daemon keeps running.
        label("broken")
        daemon.wait_for("config entry 'broken' (from label) was not applied; still serving entry 'ts'")
        assert daemon.in_force() == "entry 'ts' (from label)"
        metric_names("ts")

        # The invalid entry fixed: taken up without another label change.
        update_entries(root, {**ENTRIES, "broken": SHARED.format(2)})
        daemon.wait_for("Config in force: entry 'broken' (from label)")
        metric_names("broken")

        # The chosen entry edited: applied again.
        update_entries(root, {**ENTRIES, "broken": SHARED.format(3)})
        daemon.wait_for("Config in force: entry 'broken' (from label)", count=2)

        # SIGHUP reloads even though nothing changed.
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for("Config in force: entry 'broken' (from label)", count=3)

        # The label removed: back to the default.
        label(None)
        daemon.wait_for("Config in force: entry 'plain' (from config.default)", count=2)
        metric_names("plain")
        assert daemon.log.count("Config in force: ") == 6, daemon.log
    finally:
        code = daemon.stop()
    assert code == 0, daemon.log
