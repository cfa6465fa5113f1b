"""`nvdp doctor` against a healthy simulated node and broken ones, as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from nvdp.config.loader import load_config
from nvdp.doctor.checks import Doctor, Where
from sim.kubelet import KubeletSim
from sim.nvml import NodeSim
from tests.integration.scrape import free_port, wait_for_http
from tests.kube.envtest import ControlPlane

from .conftest import MakePlugin, clean_env

pytestmark = pytest.mark.slow
ORDER = ["nvml", "driver", "gpus", "runtime", "kubelet", "registration", "config", "mps", "mig"]


def fake_sysfs(root: Path, node: NodeSim) -> Path:
    """/sys/bus/pci/devices with the simulated node's GPUs, as the kernel lists them."""
    for gpu in node.inventory.gpus:
        domain, _, rest = gpu.pci_bus_id.lower().partition(":")
        device = root / "bus" / "pci" / "devices" / f"{int(domain, 16):04x}:{rest}"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text("0x030200\n")
    return root


def driver_root(root: Path) -> Path:
    """A container driver root with the device nodes the runtime would inject."""
    (root / "dev").mkdir(parents=True)
    (root / "dev" / "nvidiactl").touch()
    return root


def doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    # These are device-plugin nodes: a DRA plugin registered on this machine's own kubelet must not count.
    env = {"KUBELET_REGISTRAR_DIR": "/nonexistent/nvdp-test-plugins-registry", **env}
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "doctor", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == "", done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["ok"] == (done.returncode == 0)
    return done.returncode, report


def by_check(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in report["checks"]}


@pytest.fixture
def t4(tmp_path: Path, nvml_library: Path) -> NodeSim:
    return NodeSim("t4", tmp_path / "state")


def node_env(node: NodeSim, tmp_path: Path, plugin_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **clean_env(),
        **node.env,
        "DEVICE_PLUGIN_PATH": str(plugin_dir),
        "DRIVER_ROOT_CTR_PATH": str(driver_root(tmp_path / "driver-root")),
        **extra,
    }


def test_healthy_plugin_pod_passes_every_check_in_order(
    make_plugin: MakePlugin, kubelet: KubeletSim, tmp_path: Path, plugin_dir: Path
) -> None:
    port = free_port()
    plugin, node = make_plugin("t4", HEALTH_ADDRESS=f"127.0.0.1:{port}")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=1, timeout=10)
    wait_for_http(port, "/readyz", 200)
    env = node_env(
        node, tmp_path, plugin_dir, HEALTH_ADDRESS=f"127.0.0.1:{port}", NVIDIA_VISIBLE_DEVICES="all"
    )
    code, report = doctor(env, "--context=container", f"--sysfs-root={fake_sysfs(tmp_path / 'sys', node)}")
    checks = by_check(report)
    assert [c["check"] for c in report["checks"]] == ORDER
    assert code == 0, report
    assert {c["status"] for c in report["checks"]} == {"PASS"}
    assert "libnvidia-ml.so" in checks["nvml"]["detail"]
    assert "on the library search path" in checks["nvml"]["detail"]
    assert checks["driver"]["detail"] == "driver 550.54.15, CUDA 12.4"
    assert checks["gpus"]["detail"] == "NVML sees 1 GPU(s), the PCI bus has 1"
    assert checks["registration"]["detail"] == "nvidia.com/gpu served; registered (per the plugin's /readyz)"
    assert checks["config"]["detail"].startswith("from defaults")
    assert plugin.stop() == 0


def test_no_nvml_library_in_the_container_says_the_runtime_did_not_inject_it(
    tmp_path: Path, plugin_dir: Path
) -> None:
    env = {
        **clean_env(),
        "DEVICE_PLUGIN_PATH": str(plugin_dir),
        "DRIVER_ROOT_CTR_PATH": str(tmp_path / "none"),
    }
    env.pop("LD_LIBRARY_PATH", None)
    code, report = doctor(env, "--context=container", f"--sysfs-root={tmp_path / 'sys'}")
    checks = by_check(report)
    assert code == 1
    assert checks["nvml"]["status"] == "FAIL"
    assert "libnvidia-ml.so.1 was not found" in checks["nvml"]["detail"]
    assert "runtimeClassName: nvidia" in checks["nvml"]["fix"]
    assert checks["driver"]["status"] == "SKIP"
    assert checks["runtime"]["status"] == "FAIL"
    assert "could not load NVML library" in checks["runtime"]["detail"]
    assert (
        "default runtime" in checks["runtime"]["fix"] and "delete the plugin pod" in checks["runtime"]["fix"]
    )
    assert checks["registration"]["status"] == "SKIP"


def test_no_kubelet_socket_names_the_path_and_the_usual_causes(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path
) -> None:
    code, report = doctor(node_env(t4, tmp_path, plugin_dir), "--context=container")
    kubelet = by_check(report)["kubelet"]
    assert code == 1
    assert kubelet["status"] == "FAIL"
    assert kubelet["detail"] == f"no kubelet socket at {plugin_dir}/kubelet.sock"
    assert "devicePlugin.kubeletRootDir" in kubelet["fix"] and "k3s" in kubelet["fix"]
    assert "--feature-gates=DevicePlugins=true" in kubelet["fix"]
    # No plugin either: the DaemonSet may not be scheduled here (nodeSelector / labels).
    registration = by_check(report)["registration"]
    assert registration["status"] == "FAIL" and "no plugin socket" in registration["detail"]
    assert "nvidia.com/gpu.present=true" in registration["fix"]


def test_mps_daemon_absent_gives_the_label_command(t4: NodeSim, tmp_path: Path, plugin_dir: Path) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 10\n"
    )
    env = node_env(
        t4,
        tmp_path,
        plugin_dir,
        CONFIG_FILE=str(config),
        NODE_NAME="gpu-node-1",
        MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
    )
    code, report = doctor(env, "--context=host")
    mps = by_check(report)["mps"]
    assert code == 1
    assert mps["status"] == "FAIL"
    assert "the daemon is not running on this node" in mps["detail"]
    assert "kubectl label node gpu-node-1 nvidia.com/mps.capable=true" in mps["fix"]


def test_bad_config_fails_with_every_problem_and_the_validate_command(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n  renameByDefault: true\n")
    code, report = doctor(node_env(t4, tmp_path, plugin_dir, CONFIG_FILE=str(config)), "--context=host")
    checks = by_check(report)
    assert code == 1
    assert checks["config"]["status"] == "FAIL"
    assert "flags.migStrategy" in checks["config"]["detail"]
    assert "renameByDefault" in checks["config"]["detail"]
    assert "nvdp config validate FILE" in checks["config"]["fix"]
    assert checks["registration"]["status"] == "SKIP"
    assert checks["nvml"]["status"] == "PASS"  # the driver checks still run on defaults


def test_mig_without_monitoring_rights_in_the_container(
    tmp_path: Path, nvml_library: Path, plugin_dir: Path
) -> None:
    node = NodeSim("h100-mig-8", tmp_path / "state")
    env = node_env(node, tmp_path, plugin_dir, MIG_STRATEGY="mixed")
    code, report = doctor(env, "--context=container")
    mig = by_check(report)["mig"]
    assert code == 1
    assert mig["status"] == "FAIL"
    assert "NVIDIA_MIG_MONITOR_DEVICES is not all" in mig["detail"]
    assert "migStrategy" in mig["fix"]


def test_text_output_numbers_checks_and_prints_fixes(tmp_path: Path, plugin_dir: Path) -> None:
    env = {
        **clean_env(),
        "DEVICE_PLUGIN_PATH": str(plugin_dir),
        "DRIVER_ROOT_CTR_PATH": str(tmp_path / "none"),
    }
    env.pop("LD_LIBRARY_PATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "doctor", "--context=container",
         f"--sysfs-root={tmp_path / 'sys'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    assert lines[0].startswith("1. [FAIL] NVML loads: NVML is not available (ERROR_LIBRARY_NOT_FOUND)")
    assert lines[1].startswith("   fix: run the plugin with the NVIDIA container runtime")
    assert lines[-1].endswith("check(s) failed")


@pytest.mark.parametrize("context", ["container", "host"])
def test_a_machine_without_a_gpu_is_told_so_once(tmp_path: Path, plugin_dir: Path, context: str) -> None:
    """No NVIDIA GPU on the PCI bus and no driver: one FAIL says so, with its own fix; nothing blames the
    container runtime, and no message is repeated."""
    (tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:02.0").mkdir(parents=True)
    (tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:02.0" / "vendor").write_text("0x8086\n")
    env = {**clean_env(), "DEVICE_PLUGIN_PATH": str(plugin_dir),
           "DRIVER_ROOT_CTR_PATH": str(tmp_path / "none")}
    env.pop("LD_LIBRARY_PATH", None)
    code, report = doctor(env, f"--context={context}", f"--sysfs-root={tmp_path / 'sys'}")
    checks = by_check(report)
    assert code == 1
    assert checks["nvml"]["status"] == "FAIL"
    assert checks["nvml"]["detail"] == (
        "NVML is not available (ERROR_LIBRARY_NOT_FOUND): this machine has no NVIDIA GPU (none on its PCI "
        "bus), so no NVIDIA driver either")
    assert checks["nvml"]["fix"].startswith("run `nvdp doctor` on a GPU node")
    assert {checks[c]["status"] for c in ("driver", "gpus", "runtime")} == {"SKIP"}
    text = json.dumps(report)
    assert "runtimeClassName" not in text and "container runtime did not" not in text
    details = [c["detail"] for c in report["checks"]]
    assert len(set(details)) == len(details) and max(len(d) for d in details) < 200


def test_host_runtime_check_reads_the_runtime_configs(tmp_path: Path) -> None:
    dev = driver_root(tmp_path / "host")
    config = load_config(env={"NVIDIA_DEV_ROOT": str(dev)})
    etc = tmp_path / "etc"
    (etc / "containerd").mkdir(parents=True)
    toml = etc / "containerd" / "config.toml"
    where = Where(env={}, context="host", etc=etc)
    toml.write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n'
    )
    finding = Doctor(where, config, None).runtime()
    assert finding.status == "FAIL" and "--set-as-default" in finding.fix
    toml.write_text(
        toml.read_text() + '  default_runtime_name = "nvidia"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
    )
    finding = Doctor(where, config, None).runtime()
    assert finding.status == "PASS" and "nvidia is the default runtime" in finding.detail
    missing = Doctor(
        Where(env={}, context="host", etc=etc), load_config(env={"NVIDIA_DEV_ROOT": str(tmp_path)}), None
    ).runtime()
    assert missing.status == "FAIL" and "modprobe nvidia" in missing.fix


def test_shm_not_shared_with_the_mps_daemon_is_found(tmp_path: Path) -> None:
    (tmp_path / "mps" / "shm").mkdir(parents=True)
    (tmp_path / "own-shm").mkdir()
    doc = Doctor(Where(env={}, context="container", shm=tmp_path / "own-shm"), None, None)
    assert doc._shm_problem(tmp_path / "mps" / "shm") == (
        f"{tmp_path / 'own-shm'} is not {tmp_path / 'mps' / 'shm'}, so MPS clients and the daemon would not "
        "share memory"
    )
    os.rmdir(tmp_path / "own-shm")
    os.symlink(tmp_path / "mps" / "shm", tmp_path / "own-shm")
    assert doc._shm_problem(tmp_path / "mps" / "shm") is None


def test_mps_check_reads_the_node_label_from_the_api(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path, kube_api: ControlPlane
) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
    )
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name)
    env = node_env(
        t4,
        tmp_path,
        plugin_dir,
        CONFIG_FILE=str(config),
        NODE_NAME=node_name,
        MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
        KUBECONFIG=str(kube_api.admin_kubeconfig),
    )
    mps = by_check(doctor(env, "--context=host")[1])["mps"]
    assert mps["detail"].startswith(f"node {node_name} lacks the label nvidia.com/mps.capable=true")
    assert mps["fix"] == f"kubectl label node {node_name} nvidia.com/mps.capable=true"
    kube_api.kubectl("label", "node", node_name, "nvidia.com/mps.capable=true")
    mps = by_check(doctor(env, "--context=host")[1])["mps"]
    assert mps["detail"].startswith(
        f"node {node_name} has nvidia.com/mps.capable=true but the MPS daemon is not"
    )
    assert "get pods -o wide" in mps["fix"]


def test_mps_daemon_pod_running_but_failing_shows_its_error(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path
) -> None:
    from nvdp.mps.paths import ResourcePaths
    from nvdp.mps.status import write_status

    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
    )
    paths = ResourcePaths(tmp_path / "mps", "nvidia.com/gpu")
    paths.base.mkdir(parents=True)
    write_status(paths.status_file, "failing", "nvidia-cuda-mps-control exited with status 1: no GPU")
    env = node_env(
        t4,
        tmp_path,
        plugin_dir,
        CONFIG_FILE=str(config),
        NODE_NAME="gpu-node-1",
        MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
    )
    mps = by_check(doctor(env, "--context=host")[1])["mps"]
    assert mps["status"] == "FAIL"
    assert (
        "running but failing; its last error: nvidia-cuda-mps-control exited with status 1: no GPU"
        in mps["detail"]
    )
    assert "label" not in mps["fix"]


def test_per_node_config_reports_the_entry_the_node_label_chooses(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path, kube_api: ControlPlane
) -> None:
    entries = tmp_path / "entries"
    entries.mkdir()
    (entries / "plain").write_text("version: v1\n")
    (entries / "broken").write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node_name, {"nvidia.com/device-plugin.config": "plain"})
    env = node_env(
        t4,
        tmp_path,
        plugin_dir,
        CONFIG_DIR=str(entries),
        DEFAULT_CONFIG="broken",
        NODE_NAME=node_name,
        KUBECONFIG=str(kube_api.admin_kubeconfig),
    )
    config = by_check(doctor(env, "--context=host")[1])["config"]
    assert config["status"] == "PASS"
    assert config["detail"].startswith(f"from {entries / 'plain'} (entry 'plain' (from label))")
    kube_api.kubectl("label", "node", node_name, "nvidia.com/device-plugin.config-")
    config = by_check(doctor(env, "--context=host")[1])["config"]
    assert config["status"] == "FAIL" and "flags.migStrategy" in config["detail"]
    kube_api.kubectl("label", "node", node_name, "nvidia.com/device-plugin.config=missing")
    config = by_check(doctor(env, "--context=host")[1])["config"]
    assert config["status"] == "FAIL"
    assert "names config 'missing', which does not exist (entries: broken, plain)" in config["detail"]


def test_nvml_that_never_answers_is_a_report_line_not_a_hang(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path
) -> None:
    env = node_env(t4, tmp_path, plugin_dir, NVML_SIM_FAIL_INIT="hang")
    code, report = doctor(env, "--context=host", "--check-timeout=1")
    checks = by_check(report)
    assert [c["check"] for c in report["checks"]] == ORDER
    assert code == 1
    assert checks["nvml"]["status"] == "FAIL"
    assert checks["nvml"]["detail"].startswith("NVML did not answer within 1 s: nvmlInit")
    assert "nvidia-smi" in checks["nvml"]["fix"] and "persistence" in checks["nvml"]["fix"]
    assert checks["driver"]["status"] == "SKIP"
    assert checks["kubelet"]["status"] == "FAIL"  # the checks after it still ran


class HtmlApiServer:
    """An HTTP server that answers every request with a login page, where the API server should be."""

    def __init__(self, status: int = 200) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"<html><body><form>Sign in</form></body></html>"
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()



def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', insecure-skip-tls-verify: false}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return path


@pytest.mark.parametrize("status", [200, 403, 502])
def test_api_server_answering_html_is_a_report_line_with_the_fix(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path, status: int
) -> None:
    server = HtmlApiServer(status)
    try:
        entries = tmp_path / "entries"
        entries.mkdir()
        (entries / "plain").write_text("version: v1\n")
        env = node_env(
            t4,
            tmp_path,
            plugin_dir,
            CONFIG_DIR=str(entries),
            DEFAULT_CONFIG="plain",
            NODE_NAME="gpu-node-1",
            KUBECONFIG=str(kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.port}")),
        )
        code, report = doctor(env, "--context=host")
    finally:
        server.server.shutdown()
    config = by_check(report)["config"]
    assert [c["check"] for c in report["checks"]] == ORDER
    assert code == 1
    assert config["status"] == "FAIL"
    assert "the node's label could not be read" in config["detail"]
    if status == 200:
        assert f"the server at http://127.0.0.1:{server.port} answered something that is not the " in (
            config["detail"]
        )
    assert "the API server address" in config["fix"]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_api_server_refusing_connections_or_tls_is_a_report_line(
    t4: NodeSim, tmp_path: Path, plugin_dir: Path, scheme: str
) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
    )
    # http: nothing listens on the port; https: a plain HTTP server, so the TLS handshake fails.
    server = HtmlApiServer()
    port = free_port() if scheme == "http" else server.port
    env = node_env(
        t4,
        tmp_path,
        plugin_dir,
        CONFIG_FILE=str(config),
        NODE_NAME="gpu-node-1",
        MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
        KUBECONFIG=str(kubeconfig(tmp_path / "kubeconfig", f"{scheme}://127.0.0.1:{port}")),
    )
    try:
        mps = by_check(doctor(env, "--context=host")[1])["mps"]
    finally:
        server.server.shutdown()
    assert mps["status"] == "FAIL"
    if scheme == "http":
        assert f"could not be read (cannot reach the API server at http://127.0.0.1:{port}" in mps["detail"]
        assert "API: check the API server address" in mps["fix"]
    else:
        assert f"could not be read (TLS with the API server at https://127.0.0.1:{port} failed" in (
            mps["detail"]
        )
        assert "API: the kubeconfig's certificate-authority" in mps["fix"]
