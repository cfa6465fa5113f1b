"""One kubelet device-plugin gRPC server per planned resource, on `<device_plugin_path>/nvidia-<name>.sock`.

The manager creates a ResourceServer per PlannedResource, calls start() and register(), feeds health
changes through update(), and stop() on shutdown or restart. Allocate and GetPreferredAllocation are
computed by the pure modules `allocate` and `preferred`; this module only translates to and from the
wire format and keeps the per-resource state consistent across threads.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

from nvdp import recording
from nvdp.config.model import Config
from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedDevice, PlannedResource
from nvdp.plugin.allocate import (
    MIG_MINORS_FILE,
    AllocationRefused,
    ContainerAllocation,
    allocate_container,
    parse_mig_minors,
    present_control_paths,
    shown_ids,
)
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.api import deviceplugin_pb2_grpc as _pb_grpc
from nvdp.plugin.grpc_import import grpc
from nvdp.plugin.preferred import PreferredAllocator

# The generated service module has no type hints.
pb_grpc: Any = _pb_grpc

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Each ListAndWatch stream holds a worker for its whole life. The kubelet keeps one per plugin (two
# for a moment around a re-registration); more are refused, so Allocate always finds free workers.
_WORKERS = 8
MAX_STREAMS = 4
# Calls beyond this (running and queued) are refused at once instead of queueing without bound.
_MAX_CONCURRENT_RPCS = 64
_READY_TIMEOUT_S = 5.0
# Distinct device-ID requests whose answers are kept per plan; the kubelet asks for few distinct sets.
_ANSWERS_KEPT = 4096
_STOP_GRACE_S = 1.0
# The kubelet reads ListAndWatch with gRPC's default receive limit; a longer list is refused on its
# side with RESOURCE_EXHAUSTED and the resource silently stays at its last list (or none).
KUBELET_MAX_RECEIVE_BYTES = 4 * 1024 * 1024


class RegistrationError(RuntimeError):
    """The kubelet could not be reached or refused the plugin; the message says which and what to check."""


class ServerStartError(RuntimeError):
    """The gRPC server could not listen on its socket."""


_bind_names = itertools.count()  # private names to bind under, unique in this process


def _file_id(path: str) -> tuple[int, int, int] | None:
    # Inode numbers are reused at once after an unlink (tmpfs), so the change time tells sockets apart.
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def socket_path_for(resource: PlannedResource, config: Config) -> str:
    return os.path.join(config.flags.plugin.device_plugin_path, f"nvidia-{resource.short_name}.sock")


def _fresh_channel(socket_path: str) -> grpc.Channel:
    # A private subchannel pool: a kubelet that just re-created its socket must not be reached through
    # a shared connection still backing off from the old one.
    return grpc.insecure_channel(f"unix://{socket_path}", options=[("grpc.use_local_subchannel_pool", 1)])


def _accepts(socket_path: str) -> None:
    """Connect to the socket once: the path is our listener, and it accepts.

    NVIDIA's plugin, too, only dials its own socket (no call) before registering. A gRPC call here
    cost 5-7 ms of start-up (a channel, the HTTP/2 handshake and the server's first call), which the
    kubelet's own first call repeats right after Register anyway.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_READY_TIMEOUT_S)
        probe.connect(socket_path)


def container_dev_root(config: Config) -> str:
    """Where the plugin sees the driver's /dev: under the mounted driver root when it has one, else /."""
    root = config.flags.plugin.container_driver_root
    return root if root and os.path.isdir(os.path.join(root, "dev")) else "/"


def read_mig_minors(path: str, logger: logging.Logger) -> dict[str, int] | None:
    try:
        return parse_mig_minors(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.warning("Cannot read MIG capability minors (%s); MIG device nodes will be refused", err)
        return None


def random_uuid() -> str:
    # Imported on first use: only the cdi-annotations strategy needs it, and uuid imports platform.
    import uuid

    return str(uuid.uuid4())


def device_message(device: PlannedDevice) -> Any:
    topology = None
    if device.numa_node is not None:
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa_node)])
    return pb.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY, topology=topology)


def list_and_watch_bytes(resource: PlannedResource) -> int:
    """The size of the resource's ListAndWatch message at its largest (every device Unhealthy)."""
    devices = [replace(d, healthy=False) for d in resource.devices]
    return int(pb.ListAndWatchResponse(devices=[device_message(d) for d in devices]).ByteSize())


def oversized(resource: PlannedResource, limit: int = KUBELET_MAX_RECEIVE_BYTES) -> str | None:
    """Why the kubelet would refuse the resource's device list, or None when it fits."""
    size = list_and_watch_bytes(resource)
    if size <= limit:
        return None
    return (
        f"{resource.name}: its {len(resource.devices)} devices make a {size / 2**20:.1f} MiB ListAndWatch "
        f"message, more than the {limit / 2**20:g} MiB the kubelet accepts; lower the replicas of this "
        "resource or share fewer devices with it"
    )


def allocation_message(allocation: ContainerAllocation) -> Any:
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in allocation.devices
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in allocation.cdi_devices],
    )


class _Answer(Struct, frozen=True):
    """An AllocateResponse and, per container, what the log says: the requested IDs as shown, and
    those that were unhealthy."""

    response: Any
    shown: tuple[str, ...]
    unhealthy: tuple[tuple[str, ...], ...]


class _DevicePluginService:
    """The DevicePlugin gRPC service; grpc calls these methods on its worker threads."""

    def __init__(self, owner: ResourceServer) -> None:
        self._owner = owner

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        return self._owner._watch(context)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return self._owner._preferred(request, context)

    def Allocate(self, request: Any, context: Any) -> Any:
        return self._owner._allocate(request, context)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


class ResourceServer:
    """Serves one resource to the kubelet. Thread-safe: update() may be called from any thread."""

    def __init__(
        self,
        resource: PlannedResource,
        config: Config,
        inventory: Inventory,
        *,
        logger: logging.Logger | None = None,
        dev_paths_present: Callable[[str], bool] | None = None,
        mig_minors_file: str = MIG_MINORS_FILE,
        cdi_uuid: Callable[[], str] | None = None,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.log = logger or logging.getLogger(__name__)
        self.socket_path = socket_path_for(resource, config)
        self._dev_paths_present = dev_paths_present
        self._mig_minors_file = mig_minors_file
        self._cdi_uuid = cdi_uuid or random_uuid
        self._lock = threading.Condition()
        self._resource = resource
        # Built by the first GetPreferredAllocation after each update, not on the health path.
        self._allocator: PreferredAllocator | None = None
        self._version = 0  # bumped on every update(); streams resend when it moves
        self._delivered = 0  # the newest version a stream has sent in full
        self._answers: dict[tuple[tuple[str, ...], ...], _Answer] = {}  # per plan; see _allocate
        self._list_message: Any = None  # per plan; see _device_list
        self._device_messages: dict[tuple[str, bool, int | None], Any] = {}
        self._stopped = False
        self._server: grpc.Server | None = None
        self._mig_minors: dict[str, int] | None = None
        self._streams = 0  # open ListAndWatch streams
        self._socket_id: tuple[int, int, int] | None = None  # identity of the socket this server made
        self._announced = False  # "Starting GRPC server" is logged once, not on every retry

    @property
    def resource(self) -> PlannedResource:
        with self._lock:
            return self._resource

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen on the socket (replacing a stale one) and confirm by connecting to it."""
        if self._server is not None:
            raise RuntimeError(f"the server for {self._resource.name} is already started")
        if self._dev_paths_present is None:
            present = present_control_paths(os.path.exists)
            self._dev_paths_present = present.__contains__
        if any(d.is_mig for d in self._resource.devices):
            self._mig_minors = read_mig_minors(self._mig_minors_file, self.log)
        if not self._announced:
            self.log.info("Starting GRPC server for '%s'", self._resource.name)
            self._announced = True
        self._make_directory()
        self._check_socket_path()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nvdp-grpc"),
            maximum_concurrent_rpcs=_MAX_CONCURRENT_RPCS,
        )
        pb_grpc.add_DevicePluginServicer_to_server(_DevicePluginService(self), server)
        # Bind under a name of our own and rename it into place: gRPC unlinks the path it bound when
        # it stops, which must not be the path a newer instance may be listening on by then.
        bound = os.path.join(os.path.dirname(self.socket_path), f".{os.getpid():x}-{next(_bind_names):x}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bound)
        try:
            port = server.add_insecure_port(f"unix://{bound}")
        except RuntimeError as err:
            raise ServerStartError(self._listen_error(str(err))) from err
        if port == 0:
            raise ServerStartError(self._listen_error("gRPC could not bind it"))
        with self._lock:
            self._stopped = False
        server.start()
        self._server = server
        try:
            os.rename(bound, self.socket_path)  # atomic: replaces a stale socket in one step
        except OSError as err:
            self.stop()
            cause = f"cannot move {bound} into place: {err.strerror}"
            raise ServerStartError(self._listen_error(cause)) from None
        self._socket_id = _file_id(self.socket_path)
        try:
            _accepts(self.socket_path)
        except OSError as err:
            self.stop()
            cause = f"does not accept connections on {self.socket_path} after starting: {err.strerror or err}"
            raise ServerStartError(f"the server for {self._resource.name} {cause}") from None
        self.log.info("Starting to serve '%s' on %s", self._resource.name, self.socket_path)

    def register(self, kubelet_socket: str, timeout: float = 5.0) -> None:
        """Announce this resource to the kubelet's Registration service."""
        name = self._resource.name
        if self._server is None:
            raise RegistrationError(f"cannot register {name}: start() the server first")
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=os.path.basename(self.socket_path),
            resource_name=name,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        hint = (
            "check that the kubelet runs and that flags.plugin.kubeletSocket / devicePluginPath point at its "
            "device-plugins directory (k3s and microk8s use other paths)"
        )
        if not os.path.exists(kubelet_socket):
            recording.registration(name, False)
            raise RegistrationError(f"cannot register {name}: no kubelet socket at {kubelet_socket}; {hint}")
        try:
            # wait_for_ready: connect (or keep retrying the connection) within the same deadline.
            with _fresh_channel(kubelet_socket) as channel:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            recording.registration(name, False)
            if not os.path.exists(kubelet_socket):
                raise RegistrationError(
                    f"cannot register {name}: {kubelet_socket} was removed while registering (the kubelet "
                    "is restarting); registering again when it is back"
                ) from err
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise RegistrationError(
                    f"cannot register {name}: the kubelet did not answer on {kubelet_socket} within "
                    f"{timeout:g}s; {hint}"
                ) from err
            raise RegistrationError(
                f"the kubelet at {kubelet_socket} refused {name}: {err.code().name}: {err.details()}"
            ) from err
        recording.registration(name, True)
        self.log.info("Registered device plugin for '%s' with Kubelet", name)

    def update(self, resource: PlannedResource) -> None:
        """Replace the advertised devices (health changes included); every open stream resends the list."""
        with self._lock:
            if resource.name != self._resource.name:
                raise ValueError(
                    f"the server for {self._resource.name} cannot serve {resource.name}; start another server"
                )
            self._resource = resource
            self._allocator = None
            self._answers = {}
            self._list_message = None
            self._version += 1
            self._lock.notify_all()

    def wait_delivered(self, timeout: float) -> None:
        """Until an open ListAndWatch stream has sent the current list (none open: at once), or `timeout`."""
        with self._lock:
            version = self._version
            self._lock.wait_for(
                lambda: self._delivered >= version or self._streams == 0 or self._stopped, timeout
            )

    def stop(self) -> None:
        """End the streams, stop serving and remove the socket. Safe to call twice."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        server, self._server = self._server, None
        if server is not None:
            self.log.info("Stopping to serve '%s' on %s", self._resource.name, self.socket_path)
            server.stop(grace=_STOP_GRACE_S).wait()
        self._remove_own_socket()

    def _listen_error(self, cause: str) -> str:
        return (
            f"cannot listen on {self.socket_path} for {self._resource.name}: {cause}; check that the "
            "directory exists, is writable by the plugin and is the kubelet's device-plugins directory"
        )

    def _make_directory(self) -> None:
        directory = os.path.dirname(self.socket_path) or "."
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:
            raise ServerStartError(self._listen_error(f"{directory} exists but is not a directory")) from None
        except OSError as err:
            raise ServerStartError(self._listen_error(f"cannot create {directory}: {err.strerror}")) from None

    def _check_socket_path(self) -> None:
        """A socket at our path (a crashed or older instance) is replaced; anything else is not ours."""
        try:
            mode = os.lstat(self.socket_path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise ServerStartError(
                f"{self.socket_path} exists and is not a socket; remove it or choose another devicePluginPath"
            )

    def _remove_own_socket(self) -> None:
        """Remove the socket only if it is still the one this server made: during a rolling update the
        next instance may already listen at the same path, and its socket must survive our exit."""
        made, self._socket_id = self._socket_id, None
        if made is not None and _file_id(self.socket_path) == made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)

    # -- RPC bodies -------------------------------------------------------------------------------------

    def _device_list(self) -> Any:
        """The list for the current version (called with the lock held), built once for every stream.

        A health change flips a few devices: the others reuse their messages from earlier versions.
        """
        if self._list_message is None:
            kept: dict[tuple[str, bool, int | None], Any] = {}  # only this version's: bounded by the list
            messages = []
            for device in self._resource.devices:
                key = (device.id, device.healthy, device.numa_node)
                message = self._device_messages.get(key)
                if message is None:
                    message = device_message(device)
                kept[key] = message
                messages.append(message)
            self._device_messages = kept
            self._list_message = pb.ListAndWatchResponse(devices=messages)
        return self._list_message

    def _watch(self, context: Any) -> Iterator[Any]:
        with self._lock:
            if self._streams >= MAX_STREAMS:
                refused = True
            else:
                refused = False
                self._streams += 1
        if refused:
            self.log.warning("Refused a ListAndWatch stream for %s: %d are open already; the kubelet needs "
                             "one", self._resource.name, MAX_STREAMS)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self._resource.name}: {MAX_STREAMS} ListAndWatch streams are open already")
        try:
            yield from self._stream(context)
        finally:
            with self._lock:
                self._streams -= 1

    def _stream(self, context: Any) -> Iterator[Any]:
        def wake() -> None:
            with self._lock:
                self._lock.notify_all()

        def changed(seen: int) -> bool:
            return self._stopped or self._version != seen or not context.is_active()

        context.add_callback(wake)  # a client that goes away must not keep a worker waiting
        with self._lock:
            seen = self._version
            message = self._device_list()
        while True:
            yield message  # returns once gRPC has sent it
            with self._lock:
                if seen > self._delivered:
                    self._delivered = seen
                    self._lock.notify_all()
                self._lock.wait_for(partial(changed, seen))
                if self._stopped or not context.is_active():
                    return
                # Several updates in between collapse into one: each message is the whole list anyway.
                seen = self._version
                message = self._device_list()

    def _allocate(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        # An answer is a pure function of the requested IDs and the plan, so it is computed once per
        # plan (update() starts afresh) - except with CDI annotations, whose key is new every time.
        key = tuple(tuple(container.devices_ids) for container in request.container_requests)
        with self._lock:
            resource, answers = self._resource, self._answers
        answer = answers.get(key)
        if answer is None:
            answer = self._answer(resource, key, context)
            if self._answers_reusable and len(answers) < _ANSWERS_KEPT:
                answers[key] = answer
        for ids, shown, unhealthy in zip(key, answer.shown, answer.unhealthy, strict=True):
            if unhealthy:
                self.log.warning(
                    "Allocate for %s includes unhealthy devices %s", resource.name, list(unhealthy)
                )
            self.log.info("Allocate %s: %s", resource.name, shown)
            recording.allocated(resource.name, len(ids))
        recording.allocate_duration(resource.name, time.perf_counter() - started)
        return answer.response

    @property
    def _answers_reusable(self) -> bool:
        return "cdi-annotations" not in self.config.flags.plugin.device_list_strategy

    def _answer(self, resource: PlannedResource, key: tuple[tuple[str, ...], ...], context: Any) -> _Answer:
        present = self._dev_paths_present or (lambda _path: False)
        messages = []
        unhealthy = []
        for ids in key:
            try:
                allocation = allocate_container(
                    resource,
                    ids,
                    self.config,
                    dev_paths_present=present,
                    mig_cap_minors=self._mig_minors,
                    cdi_uuid=self._cdi_uuid,
                )
            except AllocationRefused as err:
                recording.allocation_refused(resource.name, err.reason)
                self.log.warning("Refused Allocate for %s %s: %s", resource.name, shown_ids(ids), err)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                raise  # abort() raises; this keeps type checkers aware of it
            messages.append(allocation_message(allocation))
            unhealthy.append(allocation.unhealthy)
        shown = tuple(shown_ids(ids) for ids in key)
        return _Answer(pb.AllocateResponse(container_responses=messages), shown, tuple(unhealthy))

    def _preferred(self, request: Any, context: Any) -> Any:
        with self._lock:
            allocator = self._allocator
            if allocator is None:
                allocator = self._allocator = PreferredAllocator(
                    self._resource, self.inventory, self.config.flags.plugin.shared_devices_allocation_policy
                )
        responses = []
        for container in request.container_requests:
            try:
                # The repeated fields as they are: turning 1024 IDs into a list first costs 50 us.
                ids = allocator.select(
                    container.available_deviceIDs, container.must_include_deviceIDs, container.allocation_size
                )
            except ValueError as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                raise
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)
