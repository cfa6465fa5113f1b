"""Metrics and probes scraped over HTTP from the running plugin process (stand-in NVML, kubelet simulator)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim, KubeletSimError
from tests.integration.scrape import free_port, get, scrape, value, wait_for_http

from .conftest import MakeBarePlugin, MakePlugin

pytestmark = pytest.mark.slow

def test_metrics_after_allocations_xid_and_sighup(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                  tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    plugin, node = make_plugin("a100-sxm-8", CONFIG_FILE=str(config))
    plugin.start(f"--metrics-address=127.0.0.1:{port}")
    kubelet.wait_for_resource("nvidia.com/gpu", count=8, healthy=8, timeout=10)
    uuids = [g.uuid for g in node.inventory.gpus]
    wait_for_http(port, "/readyz", 200)
    kubelet.allocate("nvidia.com/gpu", [[uuids[0]], uuids[1:3]])
    kubelet.allocate("nvidia.com/gpu", [uuids[3:7]])
    with pytest.raises(KubeletSimError):
        kubelet.allocate("nvidia.com/gpu", [["GPU-not-on-this-node"]])
    plugin.wait_for_log("Health checks:")
    node.inject_xid(uuids[5], 13)  # ignored by default
    node.inject_xid(uuids[5], 79)
    kubelet.wait_for_resource("nvidia.com/gpu", count=8, healthy=7, timeout=10)

    samples = scrape(port)
    assert value(samples, "nvdp_build_info", version="0.1.0", component="device-plugin",
                 python=next(dict(k[1])["python"] for k in samples if k[0] == "nvdp_build_info")) == 1
    assert value(samples, "nvdp_devices", resource="nvidia.com/gpu", health="healthy") == 7
    assert value(samples, "nvdp_devices", resource="nvidia.com/gpu", health="unhealthy") == 1
    assert value(samples, "nvdp_resource_registered", resource="nvidia.com/gpu") == 1
    assert value(samples, "nvdp_registrations_total", resource="nvidia.com/gpu", result="success") == 1
    assert value(samples, "nvdp_allocations_total", resource="nvidia.com/gpu") == 3
    assert value(samples, "nvdp_allocation_devices_count", resource="nvidia.com/gpu") == 3
    assert value(samples, "nvdp_allocation_devices_sum", resource="nvidia.com/gpu") == 7
    assert value(samples, "nvdp_allocation_devices_bucket", resource="nvidia.com/gpu", le="1.0") == 1
    assert value(samples, "nvdp_allocation_refusals_total", resource="nvidia.com/gpu",
                 reason="unknown-device") == 1
    assert value(samples, "nvdp_allocate_duration_seconds_count", resource="nvidia.com/gpu") == 2
    assert value(samples, "nvdp_xid_events_total", gpu=uuids[5], xid="13", action="ignored") == 1
    assert value(samples, "nvdp_xid_events_total", gpu=uuids[5], xid="79", action="critical") == 1
    assert value(samples, "nvdp_config_active", source=str(config), entry="") == 1
    assert value(samples, "nvdp_kubelet_restarts_total") == 0
    assert value(samples, "nvdp_gpu_unhealthy", gpu=uuids[5], state="needs-reset") == 1  # XID 79
    # No high-cardinality labels: no device IDs, pods or containers anywhere.
    labels = {name for _, pairs in samples for name, _ in pairs}
    assert labels <= {"resource", "health", "result", "reason", "gpu", "xid", "action", "source", "entry",
                      "le", "version", "component", "python", "state", "how"}

    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                      "      - name: nvidia.com/gpu\n        replicas: 2\n")
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload applied:")
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=16, timeout=10)
    healthy = sum(d["health"] == "Healthy" for d in devices)
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    plugin.signal(signal.SIGHUP)
    plugin.wait_for_log("Reload failed")
    kubelet.restart()
    plugin.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet", count=2)

    samples = scrape(port)
    assert value(samples, "nvdp_config_reloads_total", result="applied") == 1
    assert value(samples, "nvdp_config_reloads_total", result="refused") == 1
    assert value(samples, "nvdp_devices", resource="nvidia.com/gpu", health="healthy") == healthy
    assert value(samples, "nvdp_devices", resource="nvidia.com/gpu", health="unhealthy") == 16 - healthy
    assert healthy == 14  # the re-plan kept the GPU down: both its replicas are Unhealthy
    assert value(samples, "nvdp_kubelet_restarts_total") == 1
    assert (value(samples, "nvdp_config_last_reload_timestamp_seconds", result="refused") or 0) > 0
    assert plugin.stop() == 0


def test_probes_follow_registration(make_plugin: MakePlugin, plugin_dir: Path) -> None:
    port = free_port()
    plugin, _node = make_plugin("t4", HEALTH_ADDRESS=f"127.0.0.1:{port}")
    plugin.start()
    plugin.wait_for_log("not registered with the kubelet yet")
    absent = f"kubelet: its socket {plugin_dir / 'kubelet.sock'} is absent"
    body = wait_for_http(port, "/readyz", 503, containing=absent)
    assert "nvidia.com/gpu: not registered (no kubelet)" in body
    # Unready but live: the kubelet being away is no reason to restart the plugin.
    body = wait_for_http(port, "/healthz", 200)
    assert "server nvidia.com/gpu: ok" in body and "health loop: ok" in body
    assert get(port, "/metrics")[0] == 404  # probes only: no metrics without --metrics-address
    with KubeletSim(plugin_dir) as kubelet:
        kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
        assert "nvidia.com/gpu: registered" in wait_for_http(port, "/readyz", 200)
        assert plugin.stop() == 0


def test_mps_waiting_for_the_daemon_is_ready_with_the_reason(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                             tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "mps.yaml"
    config.write_text("version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n"
                      "        replicas: 4\n")
    plugin, _node = make_plugin("t4", CONFIG_FILE=str(config), MPS_CONTAINER_ROOT=str(tmp_path / "mps"),
                                NODE_NAME="gpu-node-1")
    plugin.start(f"--metrics-address=127.0.0.1:{port}")
    plugin.wait_for_log("waiting for the MPS control daemon")
    body = wait_for_http(port, "/readyz", 200)
    assert "kubectl label node gpu-node-1 nvidia.com/mps.capable=true" in body
    assert value(scrape(port), "nvdp_mps_daemon_ready", resource="nvidia.com/gpu") == 0
    assert plugin.stop() == 0


def test_metrics_port_taken_exits_1_naming_it(make_bare_plugin: MakeBarePlugin) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        plugin = make_bare_plugin()
        plugin.start(f"--metrics-address=127.0.0.1:{port}")
        assert plugin.wait() == 1
    assert f"cannot listen on 127.0.0.1:{port}" in plugin.log
    assert "choose another port" in plugin.log


def test_bad_metrics_address_is_a_usage_error(make_bare_plugin: MakeBarePlugin) -> None:
    plugin = make_bare_plugin()
    plugin.start("--metrics-address=9445")
    assert plugin.wait() == 2
    assert "--metrics-address: '9445' is not an address: use HOST:PORT or :PORT" in plugin.log


def test_no_nvml_without_fail_on_init_error_is_ready_with_nothing(make_bare_plugin: MakeBarePlugin) -> None:
    port = free_port()
    plugin = make_bare_plugin(FAIL_ON_INIT_ERROR="false", HEALTH_ADDRESS=f"127.0.0.1:{port}")
    plugin.start()
    plugin.wait_for_log("No devices found. Waiting indefinitely.")
    assert "no resources planned on this node" in wait_for_http(port, "/readyz", 200)
    assert wait_for_http(port, "/healthz", 200) == "live\n"
    assert plugin.stop() == 0


def test_active_config_names_the_per_node_entry(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                tmp_path: Path) -> None:
    port = free_port()
    entries = tmp_path / "entries"
    entries.mkdir()
    (entries / "plain").write_text("version: v1\n")
    (entries / "shared").write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                    "      - name: nvidia.com/gpu\n        replicas: 2\n")
    plugin, _node = make_plugin("t4", CONFIG_DIR=str(entries), DEFAULT_CONFIG="shared")
    plugin.start(f"--metrics-address=127.0.0.1:{port}")
    wait_for_http(port, "/healthz", 200)
    # The first scrape that shows the resource registered names the config it comes from too.
    deadline = time.monotonic() + 10
    while value(samples := scrape(port), "nvdp_resource_registered", resource="nvidia.com/gpu") != 1:
        assert time.monotonic() < deadline, "nvidia.com/gpu did not register in 10 s"
    assert value(samples, "nvdp_config_active", source=str(entries / "shared"), entry="shared") == 1
    kubelet.wait_for_resource("nvidia.com/gpu", count=2, timeout=10)
    assert plugin.stop() == 0


@contextmanager
def slow_and_idle_clients(port: int, idle: int) -> Iterator[None]:
    """One client sending a request a byte at a time and `idle` connected clients sending nothing,
    each opened again whenever the server drops it, until the block ends."""
    stop = threading.Event()

    def dribble() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    for byte in b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n":
                        if stop.wait(0.5):
                            return
                        conn.send(bytes([byte]))
            except OSError:
                continue  # dropped: come back

    def stay_idle() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    conn.settimeout(0.2)
                    while not stop.is_set():
                        try:
                            if not conn.recv(1):
                                break  # dropped: come back
                        except TimeoutError:
                            continue
            except OSError:
                continue

    threads = [threading.Thread(target=dribble)] + [threading.Thread(target=stay_idle) for _ in range(idle)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def test_slow_and_idle_clients_do_not_keep_the_probes_from_answering(make_plugin: MakePlugin,
                                                                    kubelet: KubeletSim) -> None:
    port = free_port()
    plugin, _node = make_plugin("t4", HEALTH_ADDRESS=f"127.0.0.1:{port}")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    wait_for_http(port, "/readyz", 200)
    answers: list[int | str] = []
    with slow_and_idle_clients(port, idle=20):
        for _ in range(7):  # the kubelet's probe: a 5 s timeout
            try:
                answers.append(get(port, "/readyz")[0])
            except OSError as err:
                answers.append(f"{type(err).__name__}: {err}")
            threading.Event().wait(0.5)
    assert answers == [200] * 7
    assert plugin.stop() == 0


def test_not_ready_while_the_kubelet_socket_is_gone(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    port = free_port()
    plugin, _node = make_plugin("t4", HEALTH_ADDRESS=f"127.0.0.1:{port}")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    wait_for_http(port, "/readyz", 200)
    kubelet.stop()  # kubelet.sock removed
    body = wait_for_http(port, "/readyz", 503, timeout=5)
    assert f"kubelet: its socket {kubelet.socket_path} is absent (kubelet not running" in body
    assert "nvidia.com/gpu: not registered (no kubelet)" in body
    assert wait_for_http(port, "/healthz", 200).startswith("live")  # unready, never dead
    kubelet.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    assert "nvidia.com/gpu: registered" in wait_for_http(port, "/readyz", 200)
    assert plugin.stop() == 0
