"""The kubelet simulator's CLI and the server's behaviour under several watchers and rapid updates."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_factories import config_with, make_inventory, whole_gpu_resource
from msgspec.structs import replace

from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.api import deviceplugin_pb2_grpc as _pb_grpc
from nvdp.plugin.server import ResourceServer
from sim.kubelet import KubeletSim, main

# The generated service module has no type hints.
pb_grpc: Any = _pb_grpc

GPU = "nvidia.com/gpu"


def _start_plugin_when_kubelet_appears(directory: Path, servers: list[ResourceServer]) -> threading.Thread:
    def run() -> None:
        sock = directory / "kubelet.sock"
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        inventory = make_inventory(2)
        server = ResourceServer(
            whole_gpu_resource(inventory), config_with(device_plugin_path=str(directory)), inventory
        )
        servers.append(server)
        server.start()
        server.register(str(sock))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_cli_allocates_and_prints_json_lines(short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    servers: list[ResourceServer] = []
    thread = _start_plugin_when_kubelet_appears(short_tmp, servers)
    try:
        status = main(
            ["--dir", str(short_tmp), "--allocate", GPU, "--count", "2", "--json", "--timeout", "10"]
        )
    finally:
        thread.join(5)
        for server in servers:
            server.stop()
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert status == 0
    kinds = [e["type"] for e in events]
    assert kinds[0] == "register" and "devices" in kinds and kinds[-1] == "allocate"
    register = events[0]
    assert (register["resource_name"], register["endpoint"], register["version"]) == (
        GPU,
        "nvidia-gpu.sock",
        "v1beta1",
    )
    allocation = events[-1]
    chosen = allocation["request"][0]
    assert len(chosen) == 2
    assert allocation["response"] == {
        "container_responses": [{"envs": {"NVIDIA_VISIBLE_DEVICES": ",".join(chosen)}}]
    }


def test_cli_reports_a_resource_that_never_registers(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["--dir", str(short_tmp), "--allocate", GPU, "--json", "--timeout", "0.2"])
    assert status == 1
    [event] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert event["type"] == "error"
    assert event["error"] == "nvidia.com/gpu: wanted a device list within 0.2s, saw no registration"


def test_every_watcher_sees_the_last_update(short_tmp: Path, kubelet: KubeletSim) -> None:
    inventory = make_inventory(4)
    resource = whole_gpu_resource(inventory)
    server = ResourceServer(resource, config_with(device_plugin_path=str(short_tmp)), inventory)
    server.start()
    try:
        server.register(str(kubelet.socket_path))
        kubelet.wait_for_resource(GPU, count=4)
        with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
            second = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
            assert len(next(second).devices) == 4
            # Many updates from several threads; whatever is coalesced, the final state must arrive.
            states = [
                replace(
                    resource,
                    devices=tuple(
                        replace(d, healthy=(i + k) % 2 == 0) for k, d in enumerate(resource.devices)
                    ),
                )
                for i in range(20)
            ]
            writers = [threading.Thread(target=server.update, args=(s,)) for s in states[:-1]]
            for w in writers:
                w.start()
            for w in writers:
                w.join()
            server.update(replace(resource, devices=resource.devices[:3]))
            kubelet.wait_for_resource(GPU, count=3, healthy=3)
            last = None
            for message in second:
                last = message
                if len(message.devices) == 3:
                    break
            assert last is not None and [d.ID for d in last.devices] == [d.id for d in resource.devices[:3]]
            second.cancel()
    finally:
        server.stop()
