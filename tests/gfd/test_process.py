"""The gpu-feature-discovery process: NVIDIA's flags and env names, the features.d output, sysfs reads.

The process runs unmodified against the stand-in NVML (real pynvml in a subprocess).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvdp.daemon.runloop import Wake, Wakes
from nvdp.gfd.discovery import Discovery, load
from nvdp.gfd.host import gpu_mode, machine_type, nvidia_gpus_present
from nvdp.gfd.options import parse_duration, parse_options
from nvdp.gfd.output import read_features_file, render, write_features_file
from nvdp.gfd.publish import FileOutput
from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile
from sim.nvml import NodeSim, build_library

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"
N = "nvidia.com/"
MPS_10 = "version: v1\nsharing:\n  mps:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 10}\n"


def gfd_env(node: NodeSim, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVML_SIM_", "GFD_")) and k not in (
        "LD_LIBRARY_PATH", "CONFIG_FILE", "MIG_STRATEGY", "NODE_NAME")}  # fmt: skip
    env.update(node.env)
    env.update(extra)
    return env


def run_gfd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvdp.gfd.main", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def nvml() -> Path:
    return build_library()


@pytest.mark.slow
def test_oneshot_file_output_with_nvidia_env_names(nvml: Path, tmp_path: Path) -> None:
    out = tmp_path / "features.d" / "gfd"
    machine = tmp_path / "product_name"
    machine.write_text("NVIDIA DGX H100\n")
    with NodeSim("h100-mig-single", tmp_path / "state") as node:
        env = gfd_env(node, {
            "GFD_ONESHOT": "true", "GFD_USE_NODE_FEATURE_API": "false", "GFD_OUTPUT_FILE": str(out),
            "GFD_MIG_STRATEGY": "single", "MIG_STRATEGY": "mixed",  # GFD_ wins, as in NVIDIA's GFD
            "GFD_MACHINE_TYPE_FILE": str(machine), "GFD_SYSFS_ROOT": str(tmp_path / "nosys"),
        })  # fmt: skip
        result = run_gfd(env)
    assert result.returncode == 0, result.stderr
    labels = read_features_file(str(out))
    assert labels[N + "gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels[N + "gpu.count"] == "56"
    assert labels[N + "mig.strategy"] == "single"
    assert labels[N + "gpu.machine"] == "NVIDIA-DGX-H100"
    assert labels[N + "gpu.slices.gi"] == "1"
    assert abs(int(labels[N + "gfd.timestamp"]) - time.time()) < 120
    assert out.read_text() == render(labels)  # sorted key=value lines
    assert out.exists()  # oneshot keeps the file


@pytest.mark.slow
def test_flags_override_env_and_config_file(nvml: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(MPS_10)
    with NodeSim("t4", tmp_path / "state") as node:
        env = gfd_env(node, {"CONFIG_FILE": str(config), "GFD_NO_TIMESTAMP": "false"})
        result = run_gfd(env, "--oneshot", "--no-timestamp", "--use-node-feature-api=false", "-o", "")
    assert result.returncode == 0, result.stderr
    printed = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert printed[N + "mps.capable"] == "true"
    assert printed[N + "gpu.product"] == "Tesla-T4-SHARED"
    assert N + "gfd.timestamp" not in printed


@pytest.mark.slow
def test_invalid_config_exits_1_naming_the_source(nvml: Path, tmp_path: Path) -> None:
    with NodeSim("t4", tmp_path / "state") as node:
        result = run_gfd(
            gfd_env(node, {"GFD_SLEEP_INTERVAL": "soon"}), "--oneshot", "--use-node-feature-api=false"
        )
    assert result.returncode == 1
    assert "GFD_SLEEP_INTERVAL" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_no_driver_with_fail_on_init_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["NVIDIA_DRIVER_ROOT"] = str(tmp_path)
    env["DRIVER_ROOT_CTR_PATH"] = str(tmp_path)
    result = run_gfd(env, "--oneshot", "--use-node-feature-api=false", "-o", str(tmp_path / "gfd"))
    assert result.returncode == 1
    assert "NVML is not available" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_periodic_run_rewrites_only_on_change_and_removes_the_file_on_exit(
    nvml: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gfd"
    with NodeSim("t4", tmp_path / "state") as node:
        env = gfd_env(node, {"GFD_SLEEP_INTERVAL": "1s", "GFD_USE_NODE_FEATURE_API": "false",
                             "GFD_OUTPUT_FILE": str(out)})  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvdp.gfd.main"], env=env, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 20
            while not out.exists():
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            first = out.stat().st_mtime_ns
            time.sleep(2.5)  # two more NVML passes
            assert out.stat().st_mtime_ns == first  # nothing changed, nothing written
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert not out.exists()  # NVIDIA #796: a stopped labeller withdraws its file


def test_parse_duration() -> None:
    assert parse_duration("60s") == 60
    assert parse_duration("1m30s") == 90
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2h") == 7200
    assert parse_duration("5000000000ns") == 5
    assert parse_duration("infinite") == math.inf
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("60")


def test_options_env_names() -> None:
    env = {"GFD_CONFIG_FILE": "/a", "CONFIG_FILE": "/b", "NODE_NAME": "n1", "NAMESPACE": "gpu",
           "GFD_PRESENCE_ONLY": "true"}  # fmt: skip
    opts = parse_options([], env)
    assert (opts.config_file, opts.node_name, opts.namespace, opts.presence_only) == ("/a", "n1", "gpu", True)
    opts = parse_options(["--oneshot", "--sleep-interval=5m", "--config-file", "/c"], {"CONFIG_FILE": "/b"})
    assert opts.config_file == "/c"
    assert opts.overrides == {"flags.gfd.oneshot": "true", "flags.gfd.sleepInterval": "5m"}
    assert parse_options([], {}).namespace == "default"


def test_config_precedence_gfd_env_over_plain_env() -> None:
    opts = parse_options(["--no-timestamp=false"], {})
    env = {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single", "GFD_NO_TIMESTAMP": "true",
           "USE_NODE_FEATURE_API": "false", "GFD_SLEEP_INTERVAL": "infinite"}  # fmt: skip
    config = load(opts, env)
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.gfd.no_timestamp is False  # the flag beats the variable
    assert config.flags.use_node_feature_api is False
    assert config.flags.gfd.sleep_interval == "infinite"


def test_features_file_is_written_atomically_and_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "d" / "gfd"
    assert write_features_file(str(path), {"b": "2", "a": "1"})
    assert path.read_text() == "a=1\nb=2\n"
    assert not write_features_file(str(path), {"a": "1", "b": "2"})
    assert [p.name for p in path.parent.iterdir()] == ["gfd"]  # no temporary file left behind
    assert read_features_file(str(path)) == {"a": "1", "b": "2"}


def test_machine_type(tmp_path: Path) -> None:
    f = tmp_path / "product_name"
    f.write_text("DGX-1 \n")
    assert machine_type(str(f)) == "DGX-1"
    assert machine_type(str(tmp_path / "missing")) == "unknown"
    assert machine_type("") == "unknown"


def fake_pci(root: Path, address: str, vendor: str, pci_class: str) -> None:
    d = root / "bus" / "pci" / "devices" / address
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(pci_class + "\n")


def test_presence_and_mode_from_sysfs(tmp_path: Path) -> None:
    fake_pci(tmp_path, "0000:00:06.0", "0x10de", "0x030200")  # T4: 3D controller
    fake_pci(tmp_path, "0000:00:07.0", "0x10de", "0x040300")  # an NVIDIA audio function
    fake_pci(tmp_path, "0000:00:08.0", "0x8086", "0x030000")  # another vendor's VGA
    fake_pci(tmp_path, "0000:00:09.0", "0x10de", "0x068000")  # NVSwitch (bridge)
    assert nvidia_gpus_present(str(tmp_path)) == ["0000:00:06.0"]
    assert nvidia_gpus_present(str(tmp_path / "none")) == []
    t4 = load_profile(PROFILES / "t4.yaml")  # bus id 00000000:00:06.0
    assert gpu_mode(t4, str(tmp_path)) == "compute"
    assert gpu_mode(t4, str(tmp_path / "none")) == "unknown"


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_loop_reads_nvml_every_interval_and_again_after_a_new_config(tmp_path: Path) -> None:
    t4 = load_profile(PROFILES / "t4.yaml")
    config_file = tmp_path / "c.yaml"
    config_file.write_text("version: v1\n")
    opts = parse_options(["--config-file", str(config_file), "--sleep-interval", "60s"], {})
    reads: list[int] = []

    def discover(_config: object) -> Inventory:
        reads.append(1)
        return t4

    output = FileOutput(str(tmp_path / "gfd"))
    clock = _Clock()
    d = Discovery(opts, load(opts, {}), output, discover=discover, clock=clock, wall_clock=clock)
    assert d.step() is None
    assert d.timeout() == 60
    clock.t += 30
    assert d.step(Wakes(frozenset({Wake.LABELS}))) is None  # a wake-up before the interval: no NVML read
    assert len(reads) == 1 and d.timeout() == 30
    clock.t += 30
    assert d.step(Wakes()) is None  # the interval passed: NVML is read again, nothing changes
    assert len(reads) == 2
    config_file.write_text(MPS_10)
    d.use(load(opts, {}))  # what the per-node rule's switch does with a new config
    assert d.step(Wakes(frozenset({Wake.RELOAD}))) is None
    labels = read_features_file(output.path)
    assert labels[N + "mps.capable"] == "true"
    assert labels[N + "gfd.timestamp"] == str(int(clock.t))
    assert len(reads) == 3  # start, after the interval, after the new config


@pytest.mark.slow
def test_sigterm_ends_the_wait_for_an_unreachable_api_server(nvml: Path, tmp_path: Path) -> None:
    """Waiting for the Node's labels from an API server that accepts and never answers: SIGTERM exits."""
    import socket

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    port = hung.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n")
    with NodeSim("t4", tmp_path / "state") as node:
        env = gfd_env(node, {"NODE_NAME": "n1", "KUBECONFIG": str(kubeconfig)})
        proc = subprocess.Popen([sys.executable, "-m", "nvdp.gfd.main", "--kubeconfig", str(kubeconfig)],
                                env=env, stderr=subprocess.PIPE, text=True)
        err = _terminate_after_start(proc, hung)
    assert proc.returncode == 0, err
    assert "Received signal SIGTERM, shutting down." in err


def _terminate_after_start(proc: subprocess.Popen[str], hung: object) -> str:
    try:
        time.sleep(8)  # past every start-up wait of a few seconds; now in the wait for the Node's labels
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=12)  # the kubelet's grace period is 30 s
    finally:
        if proc.poll() is None:
            proc.kill()
        hung.close()  # type: ignore[attr-defined]
    return err


@pytest.mark.slow
def test_no_driver_without_fail_on_init_error_keeps_retrying(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update({"NVIDIA_DRIVER_ROOT": str(tmp_path), "DRIVER_ROOT_CTR_PATH": str(tmp_path),
                "GFD_FAIL_ON_INIT_ERROR": "false", "GFD_SLEEP_INTERVAL": "1s"})  # fmt: skip
    args = ["--use-node-feature-api=false", "-o", str(tmp_path / "gfd")]
    proc = subprocess.Popen([sys.executable, "-m", "nvdp.gfd.main", *args], env=env, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    time.sleep(3)
    assert proc.poll() is None, "exited although failOnInitError is false"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert err.count("NVML is not available") >= 2  # retried every interval
    assert "failOnInitError is false" in err
    assert not (tmp_path / "gfd").exists()  # nothing labelled from a node it could not read


def test_health_labels_follow_the_plugins_record_between_nvml_reads(tmp_path: Path) -> None:
    from nvdp.health.ledger import Cause, Ledger, Settings
    from nvdp.health.state import write_state
    from nvdp.health.xids import Remedy

    t4 = load_profile(PROFILES / "t4.yaml")
    uuid = t4.gpus[0].uuid
    health = tmp_path / "health"
    opts = parse_options(["--sleep-interval", "60s"], {"HEALTH_STATE_DIR": str(health)})
    reads: list[int] = []

    def discover(_config: object) -> Inventory:
        reads.append(1)
        return t4

    output = FileOutput(str(tmp_path / "gfd"))
    clock = _Clock()
    d = Discovery(opts, load(opts, {"HEALTH_STATE_DIR": str(health)}), output, discover=discover, clock=clock,
                  wall_clock=clock)
    assert d.step() is None
    assert d.timeout() == 2  # the record is looked at every 2 s between NVML reads
    assert N + "gpu.unhealthy" not in read_features_file(output.path)
    ledger = Ledger(Settings(after=60))
    ledger.fault(uuid, {uuid}, Cause("XID 95 (uncontained ECC error)", Remedy.RESET, 95), clock.t)
    write_state(str(health), "nvidia-device-plugin", ledger.record(), clock.t)
    clock.t += 2
    assert d.step(Wakes()) is None
    labels = read_features_file(output.path)
    assert (labels[N + "gpu.unhealthy"], labels[N + "gpu.needs-service"]) == ("1", "1")
    clock.t += 2
    passes = d.passes
    assert d.step(Wakes()) is None and d.passes == passes  # nothing new: no pass at all
    ledger.clear(None, clock.t)
    write_state(str(health), "nvidia-device-plugin", ledger.record(), clock.t)
    clock.t += 2
    assert d.step(Wakes()) is None
    labels = read_features_file(output.path)
    assert N + "gpu.unhealthy" not in labels and N + "gpu.needs-service" not in labels
    assert len(reads) == 1  # all of it from the one NVML read
