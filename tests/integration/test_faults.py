"""The plugin process under faults: a kubelet that never answers, signal storms, rolling updates,
clients holding streams open. Each bound below is far above what a healthy plugin needs and far
below what the fault cost before it was handled."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import grpc
import pytest

from nvdp.config.loader import load_config
from nvdp.plan import plan
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.wire import pb_grpc
from sim.kubelet import KubeletSim

from .conftest import MakePlugin

pytestmark = pytest.mark.slow


def test_sigterm_is_not_held_up_by_a_kubelet_that_never_answers(make_plugin: MakePlugin,
                                                                  plugin_dir: Path) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(plugin_dir / "kubelet.sock"))
    silent.listen(64)  # connections are accepted by the kernel; nothing ever answers
    try:
        plugin, node = make_plugin("h100-mig-8", MIG_STRATEGY="mixed")
        resources = plan(load_config(env={"MIG_STRATEGY": "mixed"}), node.inventory).resources
        assert len(resources) >= 5
        plugin.start()
        plugin.wait_for_log("Starting to serve", count=len(resources), timeout=20)
        started = time.monotonic()
        plugin.signal(signal.SIGTERM)
        # Registrations are in flight (5 s each); shutting down must not wait for them, one by one.
        assert plugin.wait(timeout=10) == 0, plugin.log
        assert time.monotonic() - started < 10
        assert plugin.sockets() == []
    finally:
        silent.close()


def test_sigterm_goes_before_queued_sighups(make_plugin: MakePlugin, kubelet: KubeletSim) -> None:
    plugin, _ = make_plugin("mixed-4")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=4, timeout=10)
    assert plugin.proc is not None
    for _ in range(20):
        plugin.signal(signal.SIGHUP)
    plugin.signal(signal.SIGTERM)
    assert plugin.wait(timeout=10) == 0, plugin.log
    # Reloads that queued up behind one another ran once, not twenty times.
    assert plugin.log.count("Received SIGHUP") < 5, plugin.log
    assert "Received signal SIGTERM, shutting down." in plugin.log


def test_an_exiting_old_instance_leaves_the_new_instance_socket(make_plugin: MakePlugin,
                                                                kubelet: KubeletSim) -> None:
    old, node = make_plugin("t4")
    old.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    old.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet")
    new, _ = make_plugin("t4")  # a rolling update with maxSurge: both run for a while
    new.start()
    new.wait_for_log("Registered device plugin for 'nvidia.com/gpu' with Kubelet")
    # The kubelet follows the newest registration: wait until it has the new instance's list.
    deadline = time.monotonic() + 10
    while sum(e["type"] == "devices" for e in kubelet.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert old.stop() == 0
    assert new.sockets() == ["nvidia-gpu.sock"]
    uuid = node.inventory.gpus[0].uuid
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    response = kubelet.allocate("nvidia.com/gpu", [[uuid]])
    assert response["container_responses"][0]["envs"] == {"NVIDIA_VISIBLE_DEVICES": uuid}
    assert new.stop() == 0
    assert new.sockets() == []


def test_idle_list_and_watch_streams_leave_allocate_answered(make_plugin: MakePlugin, kubelet: KubeletSim,
                                                            plugin_dir: Path) -> None:
    plugin, node = make_plugin("t4")
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    uuid = node.inventory.gpus[0].uuid
    with grpc.insecure_channel(f"unix://{plugin_dir / 'nvidia-gpu.sock'}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        streams = [stub.ListAndWatch(pb.Empty()) for _ in range(10)]
        for stream in streams:
            try:
                next(stream)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for _ in range(10):
            response = kubelet.allocate("nvidia.com/gpu", [[uuid]], timeout=5)
            assert response["container_responses"][0]["envs"] == {"NVIDIA_VISIBLE_DEVICES": uuid}
        for stream in streams:
            stream.cancel()
    # The kubelet's own stream was never the one refused.
    assert kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=5)
    assert plugin.stop() == 0
