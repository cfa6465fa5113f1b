"""The floor: the least a Python device plugin must do, measured beside nvdp by plugin_bench.py.

    DEVICE_PLUGIN_PATH=/var/lib/kubelet/device-plugins python bench/floor_plugin.py

The interpreter, a plain `import grpc`, the generated API nvdp also uses (nvdp.plugin.api), pynvml on
whatever libnvidia-ml.so.1 the loader finds (init, device count, UUIDs), one grpc.server with a thread
pool on a unix socket, Register with the kubelet, and the five DevicePlugin calls answered as simply
as they can be: nvidia.com/gpu, one ID per GPU, NVIDIA_VISIBLE_DEVICES = the requested IDs. After
registering, one thread waits for critical XID events and marks the GPU's IDs Unhealthy in the list
sent on ListAndWatch. Nothing else: no config, re-registration or logging beyond errors. SIGTERM
stops it with status 0.

FLOOR_REPLICAS=N (N > 1) advertises N IDs per GPU (`<uuid>::<n>`, as time-slicing names them), so the
floor can answer the same 8x128 GetPreferredAllocation as the plugins configured for time-slicing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

# Plain grpc, imported before the API package, so that nvdp's own way of importing grpc (which the
# API package's __init__ applies when it comes first) changes nothing here.
import grpc
import pynvml

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src"))
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.api import deviceplugin_pb2_grpc as pb_grpc_untyped

pb_grpc: Any = pb_grpc_untyped

RESOURCE = "nvidia.com/gpu"
SOCKET = "nvidia-gpu.sock"
REPLICAS = int(os.environ.get("FLOOR_REPLICAS") or 1)


def gpu_uuids() -> list[str]:
    pynvml.nvmlInit()
    count: int = pynvml.nvmlDeviceGetCount()
    return [str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]


def advertised_ids(uuids: list[str]) -> list[str]:
    if REPLICAS > 1:
        return [f"{uuid}::{n}" for uuid in uuids for n in range(REPLICAS)]
    return uuids


def visible_devices(ids: Sequence[str]) -> str:
    if REPLICAS > 1:  # replicas of one GPU make it visible once
        return ",".join(dict.fromkeys(i.partition("::")[0] for i in ids))
    return ",".join(ids)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    chosen = list(must_include)
    for device_id in available:
        if len(chosen) >= size:
            break
        if device_id not in chosen:
            chosen.append(device_id)
    return chosen


def gpu_of(device_id: str) -> str:
    return device_id.partition("::")[0]


class DevicePlugin:
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.unhealthy: set[str] = set()  # GPU UUIDs
        self.version = 0
        self.changed = threading.Condition()
        self.devices = self.device_list()

    def device_list(self) -> Any:
        health = {True: "Unhealthy", False: "Healthy"}
        return pb.ListAndWatchResponse(devices=[
            pb.Device(ID=i, health=health[gpu_of(i) in self.unhealthy]) for i in self.ids
        ])

    def mark_unhealthy(self, uuid: str) -> None:
        with self.changed:
            self.unhealthy.add(uuid)
            self.devices = self.device_list()
            self.version += 1
            self.changed.notify_all()

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        ended = False

        def end() -> None:
            nonlocal ended
            with self.changed:
                ended = True
                self.changed.notify_all()

        if not context.add_callback(end):  # the stream has ended already
            return
        seen = -1
        while True:
            with self.changed:
                while not ended and self.version == seen:
                    self.changed.wait()
                if ended:
                    return
                seen, message = self.version, self.devices
            yield message

    def Allocate(self, request: Any, context: Any) -> Any:
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": visible_devices(c.devices_ids)})
            for c in request.container_requests
        ])

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse(container_responses=[
            pb.ContainerPreferredAllocationResponse(
                deviceIDs=preferred(c.available_deviceIDs, c.must_include_deviceIDs, c.allocation_size))
            for c in request.container_requests
        ])

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


def watch_xids(plugin: DevicePlugin, stop: threading.Event) -> None:
    """Critical XIDs turn the GPU Unhealthy, as every plugin must; NVML errors end the watch."""
    try:
        event_set = pynvml.nvmlEventSetCreate()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        while not stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
            except pynvml.NVMLError_Timeout:
                continue
            plugin.mark_unhealthy(str(pynvml.nvmlDeviceGetUUID(data.device)))
    except pynvml.NVMLError as err:
        print(f"floor plugin: health checks end: {err}", file=sys.stderr)


REGISTER = pb.RegisterRequest(version="v1beta1", endpoint=SOCKET, resource_name=RESOURCE,
                              options=pb.DevicePluginOptions(get_preferred_allocation_available=True))


def listen(server: Any, plugin: DevicePlugin, plugin_dir: str) -> None:
    """Serve `plugin` on SOCKET in `plugin_dir`, replacing a stale socket."""
    pb_grpc.add_DevicePluginServicer_to_server(plugin, server)
    socket_path = os.path.join(plugin_dir, SOCKET)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    if server.add_insecure_port(f"unix://{socket_path}") == 0:
        raise OSError(f"cannot listen on {socket_path}")


def kubelet_address(plugin_dir: str) -> str:
    return f"unix://{os.path.join(plugin_dir, 'kubelet.sock')}"


def serve(plugin_dir: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    plugin = DevicePlugin(advertised_ids(gpu_uuids()))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    listen(server, plugin, plugin_dir)
    server.start()
    try:
        with grpc.insecure_channel(kubelet_address(plugin_dir)) as channel:
            pb_grpc.RegistrationStub(channel).Register(REGISTER, timeout=10, wait_for_ready=True)
        # Health checking starts after Register, as in NVIDIA's plugin.
        threading.Thread(target=watch_xids, args=(plugin, stop), daemon=True).start()
        stop.wait()
    finally:
        server.stop(0).wait()


def main() -> int:
    plugin_dir = os.environ.get("DEVICE_PLUGIN_PATH", "/var/lib/kubelet/device-plugins")
    try:
        serve(plugin_dir)
    except (pynvml.NVMLError, grpc.RpcError, OSError) as err:
        print(f"floor plugin: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
