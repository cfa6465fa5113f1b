"""A kubelet stand-in for tests, the benchmark and the demo: the device-manager half of the kubelet.

Never installed with nvdp and never in the released images: it removes any `kubelet.sock` in the
directory it is given.

It serves `Registration` on `<dir>/kubelet.sock`; for each registration it connects back to
`<dir>/<endpoint>`, asks for the plugin's options and follows ListAndWatch, keeping the latest device
list per resource. Allocate and GetPreferredAllocation can then be called the way the kubelet would.

    with KubeletSim(tmp_dir) as kubelet:
        ...start a plugin with device_plugin_path=tmp_dir...
        devices = kubelet.wait_for_resource("nvidia.com/gpu", count=8)
        response = kubelet.allocate("nvidia.com/gpu", [[devices[0]["id"]]])

CLI: python -m sim.kubelet --dir D [--allocate RES --count N] [--duration S] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from msgspec import Struct, field

from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.api import deviceplugin_pb2_grpc as _pb_grpc

# The generated service module has no type hints.
pb_grpc: Any = _pb_grpc

KUBELET_SOCKET = "kubelet.sock"
SUPPORTED_VERSIONS = ("v1beta1",)
_CONNECT_TIMEOUT_S = 5.0

Event = dict[str, Any]


class KubeletSimError(RuntimeError):
    """A call to a plugin failed; `code` and `details` are the gRPC status, when there is one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class _Plugin(Struct):
    """The sim's side of one registered resource."""

    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: Any
    options: Event = field(default_factory=dict)
    stream: Any = None
    devices: list[Event] | None = None  # None until the first ListAndWatch message
    connected: bool = True


def _device_dict(device: Any) -> Event:
    numa = [int(n.ID) for n in device.topology.nodes] if device.HasField("topology") else []
    return {"id": device.ID, "health": device.health, "numa_nodes": numa}


class KubeletSim:
    """Context manager: `start()` on enter, `stop()` on exit. All methods are thread-safe."""

    def __init__(
        self,
        dir: Path | str,
        *,
        socket_name: str = KUBELET_SOCKET,
        listener: Callable[[Event], None] | None = None,
    ) -> None:
        self.dir = Path(dir)
        self.socket_path = self.dir / socket_name
        self.registrations: list[Event] = []
        self.events: list[Event] = []
        self._listener = listener
        self._lock = threading.Condition()
        self._plugins: dict[str, _Plugin] = {}
        self._server: grpc.Server | None = None

    # -- lifecycle --------------------------------------------------------------------------------------

    def __enter__(self) -> KubeletSim:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._server is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-sim"))
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise KubeletSimError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """Stop serving Registration, drop every plugin connection and remove kubelet.sock."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=0.5).wait()
        with self._lock:
            plugins = list(self._plugins.values())
            self._plugins.clear()
            self._lock.notify_all()
        for plugin in plugins:
            self._close(plugin)
        if self.socket_path.exists():
            self.socket_path.unlink()

    def restart(self) -> None:
        """Like a kubelet restart: kubelet.sock disappears and comes back, plugins must register again."""
        self.stop()
        self.start()

    # -- what the kubelet knows -------------------------------------------------------------------------

    def resources(self) -> list[str]:
        """Resources with a live plugin connection."""
        with self._lock:
            return sorted(name for name, p in self._plugins.items() if p.connected)

    def devices(self, name: str) -> list[Event]:
        """The latest device list of `name` ([] when unknown): dicts with id, health, numa_nodes."""
        with self._lock:
            plugin = self._plugins.get(name)
            return [] if plugin is None or plugin.devices is None else [dict(d) for d in plugin.devices]

    def options(self, name: str) -> Event:
        with self._lock:
            plugin = self._plugins.get(name)
            return {} if plugin is None else dict(plugin.options)

    def wait_for_registration(self, timeout: float = 5.0, alive: Callable[[], bool] | None = None) -> str:
        """Block until a plugin has registered; returns the first registration's resource name.
        TimeoutError when none came within `timeout`, or as soon as `alive()` says the plugin is gone."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self.registrations:
                left = deadline - time.monotonic()
                gone = alive is not None and not alive()
                if left <= 0 or gone:
                    why = "the plugin exited" if gone else f"no plugin registered within {timeout:g}s"
                    raise TimeoutError(why)
                self._lock.wait(min(left, 0.05))
            return str(self.registrations[0]["resource_name"])

    def wait_for_resource(
        self, name: str, count: int | None = None, healthy: int | None = None, timeout: float = 5.0
    ) -> list[Event]:
        """Block until `name` is connected and has a device list with `count` devices, `healthy` of them
        Healthy (either None: any). Returns that list; TimeoutError says what was seen instead."""

        def matches() -> bool:
            plugin = self._plugins.get(name)
            if plugin is None or not plugin.connected or plugin.devices is None:
                return False
            if count is not None and len(plugin.devices) != count:
                return False
            good = sum(1 for d in plugin.devices if d["health"] == "Healthy")
            return healthy is None or good == healthy

        with self._lock:
            if not self._lock.wait_for(matches, timeout=timeout):
                plugin = self._plugins.get(name)
                if plugin is None:
                    seen = "no registration"
                elif plugin.devices is None:
                    seen = "a registration but no device list yet"
                else:
                    good = sum(1 for d in plugin.devices if d["health"] == "Healthy")
                    state = "connected" if plugin.connected else "disconnected"
                    seen = f"{len(plugin.devices)} devices, {good} healthy ({state})"
                wanted = [f"{count} devices" if count is not None else "a device list"]
                if healthy is not None:
                    wanted.append(f"{healthy} healthy")
                raise TimeoutError(f"{name}: wanted {', '.join(wanted)} within {timeout:.3g}s, saw {seen}")
            return [dict(d) for d in self._plugins[name].devices or []]

    def wait_for_disconnect(self, name: str, timeout: float = 5.0) -> None:
        """Block until the plugin serving `name` is gone (its stream ended, or it never registered)."""

        def gone() -> bool:
            plugin = self._plugins.get(name)
            return plugin is None or not plugin.connected

        with self._lock:
            if not self._lock.wait_for(gone, timeout=timeout):
                raise TimeoutError(f"{name}: the plugin was still connected after {timeout:.3g}s")

    # -- calls the kubelet makes ------------------------------------------------------------------------

    def allocate(self, name: str, ids: list[list[str]], timeout: float = 5.0) -> Event:
        """Allocate one container per inner list; returns the response as a JSON-able dict."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(c)) for c in ids]
        )
        response = self._call(name, "Allocate", request, timeout)
        result: Event = MessageToDict(response, preserving_proto_field_name=True)
        self._emit({"type": "allocate", "resource": name, "request": ids, "response": result})
        return result

    def preferred(
        self,
        name: str,
        available: Iterable[str],
        must_include: Iterable[str],
        size: int,
        timeout: float = 5.0,
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = self._call(name, "GetPreferredAllocation", request, timeout)
        return list(response.container_responses[0].deviceIDs)

    # -- internals --------------------------------------------------------------------------------------

    def _call(self, name: str, method: str, request: Any, timeout: float) -> Any:
        with self._lock:
            plugin = self._plugins.get(name)
        if plugin is None or not plugin.connected:
            raise KubeletSimError(f"{method} {name}: no plugin is registered for {name}")
        try:
            return getattr(plugin.stub, method)(request, timeout=timeout)
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
            raise KubeletSimError(f"{method} {name} failed: {code.name}: {details}", code, details) from err

    def _emit(self, event: Event) -> None:
        event = {"time": time.time(), "monotonic": time.monotonic(), **event}
        listener = self._listener
        if listener is not None:
            listener(event)

    def _register(self, request: Any) -> str | None:
        """Record a registration; returns a refusal message, or None and connects in the background."""
        entry: Event = {
            "time": time.time(),
            "monotonic": time.monotonic(),
            "version": request.version,
            "endpoint": request.endpoint,
            "resource_name": request.resource_name,
            "options": MessageToDict(
                request.options, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            ),
        }
        with self._lock:
            self.registrations.append(entry)
            self._lock.notify_all()
        self._emit({"type": "register", **{k: v for k, v in entry.items() if k not in ("time", "monotonic")}})
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f"unsupported device plugin API version {request.version!r}; supported: {SUPPORTED_VERSIONS}"
            )
        if not request.resource_name or "/" not in request.resource_name:
            return f"invalid resource name {request.resource_name!r}; expected <domain>/<name>"
        # Like the kubelet, answer Register first and dial the plugin afterwards.
        threading.Thread(
            target=self._connect, args=(request.resource_name, request.endpoint), daemon=True
        ).start()
        return None

    def _connect(self, name: str, endpoint: str) -> None:
        # A connection of its own, as the kubelet makes one per registration: a shared subchannel could
        # still lead to the previous plugin listening at the same path.
        channel = grpc.insecure_channel(
            f"unix://{self.dir / endpoint}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        plugin = _Plugin(
            resource=name, endpoint=endpoint, channel=channel, stub=pb_grpc.DevicePluginStub(channel)
        )
        try:
            grpc.channel_ready_future(channel).result(timeout=_CONNECT_TIMEOUT_S)
            options = plugin.stub.GetDevicePluginOptions(pb.Empty(), timeout=_CONNECT_TIMEOUT_S)
            plugin.options = MessageToDict(
                options, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
            plugin.stream = plugin.stub.ListAndWatch(pb.Empty())
        except (grpc.RpcError, grpc.FutureTimeoutError) as err:
            channel.close()
            self._emit({"type": "connect-failed", "resource": name, "endpoint": endpoint, "error": repr(err)})
            return
        with self._lock:
            old = self._plugins.get(name)
            self._plugins[name] = plugin
            self._lock.notify_all()
        if old is not None:
            self._close(old)
        self._follow(plugin)

    def _follow(self, plugin: _Plugin) -> None:
        try:
            for response in plugin.stream:
                devices = [_device_dict(d) for d in response.devices]
                event = {"type": "devices", "resource": plugin.resource, "devices": devices}
                with self._lock:
                    if self._plugins.get(plugin.resource) is not plugin:
                        return
                    plugin.devices = devices
                    self.events.append({"time": time.time(), "monotonic": time.monotonic(), **event})
                    self._lock.notify_all()
                self._emit(event)
        except grpc.RpcError:
            pass  # the stream ends with an error when the plugin stops or the sim cancels it
        with self._lock:
            if self._plugins.get(plugin.resource) is not plugin:
                return
            plugin.connected = False
            event = {"type": "disconnected", "resource": plugin.resource}
            self.events.append({"time": time.time(), "monotonic": time.monotonic(), **event})
            self._lock.notify_all()
        self._emit(event)

    @staticmethod
    def _close(plugin: _Plugin) -> None:
        plugin.connected = False
        if plugin.stream is not None:
            plugin.stream.cancel()
        plugin.channel.close()


class _RegistrationService:
    def __init__(self, sim: KubeletSim) -> None:
        self._sim = sim

    def Register(self, request: Any, context: Any) -> Any:
        refusal = self._sim._register(request)
        if refusal is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
        return pb.Empty()


# --- CLI -------------------------------------------------------------------------------------------------


def _printer(as_json: bool) -> Callable[[Event], None]:
    lock = threading.Lock()

    def show(event: Event) -> None:
        if as_json:
            line = json.dumps(event, sort_keys=True)
        else:
            kind = event.get("type")
            if kind == "register":
                line = f"registered {event['resource_name']} at {event['endpoint']} ({event['version']})"
            elif kind == "devices":
                good = sum(1 for d in event["devices"] if d["health"] == "Healthy")
                line = f"{event['resource']}: {len(event['devices'])} devices, {good} healthy"
            elif kind == "allocate":
                line = f"allocated {event['resource']} {event['request']}: {json.dumps(event['response'])}"
            else:
                line = f"{kind}: {json.dumps({k: v for k, v in event.items() if k != 'type'})}"
        with lock:
            print(line, flush=True)

    return show


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim.kubelet",
        description="Serve the kubelet's device-plugin Registration socket and follow registered plugins.",
    )
    parser.add_argument(
        "--dir", required=True, type=Path, help="device-plugins directory (kubelet.sock goes here)"
    )
    parser.add_argument(
        "--allocate", metavar="RES", help="after RES registers, allocate --count devices of it"
    )
    parser.add_argument("--count", type=int, default=1, help="devices to allocate (default: %(default)s)")
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds to run (default: until interrupted, or until --allocate is done)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for RES (default: %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")

    show = _printer(args.json)
    started = time.monotonic()
    try:
        with KubeletSim(args.dir, listener=show) as sim:
            if args.allocate:
                status = _allocate_once(sim, args.allocate, args.count, args.timeout, show)
                if status != 0 or args.duration is None:
                    return status
            remaining = (
                None if args.duration is None else max(0.0, args.duration - (time.monotonic() - started))
            )
            stop = threading.Event()
            stop.wait(remaining)
    except KeyboardInterrupt:
        return 130
    return 0


def _allocate_once(
    sim: KubeletSim, name: str, count: int, timeout: float, show: Callable[[Event], None]
) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            devices = sim.wait_for_resource(name, timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError as err:
            show({"type": "error", "error": str(err)})
            return 1
        available = [d["id"] for d in devices if d["health"] == "Healthy"]
        if len(available) >= count:
            break
        if time.monotonic() >= deadline:
            show({"type": "error", "error": f"{name}: {len(available)} healthy devices, {count} requested"})
            return 1
        time.sleep(0.05)
    try:
        if sim.options(name).get("get_preferred_allocation_available"):
            chosen = sim.preferred(name, available, [], count)
        else:
            chosen = available[:count]
        sim.allocate(name, [chosen])
    except KubeletSimError as err:
        show({"type": "error", "error": str(err)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
