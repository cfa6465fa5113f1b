"""The DevicePlugin service's RPC bodies for one resource: ListAndWatch streams, Allocate and
GetPreferredAllocation answered from the resource as currently planned.

The servicer holds what is served (the resource, its version, the cached answers) and is
thread-safe: gRPC calls its methods on worker threads while `update()` may come from any thread.
Allocate and GetPreferredAllocation are computed by the pure modules `allocate` and `preferred`;
messages are built by `wire`. The socket and the gRPC server around it are `server.py`'s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from msgspec import Struct

from nvdp.config.model import Config
from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedResource
from nvdp.plugin.allocate import (
    MIG_MINORS_FILE,
    AllocationRefused,
    allocate_container,
    parse_mig_minors,
    present_control_paths,
    shown_ids,
)
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.preferred import PreferredAllocator
from nvdp.plugin.wire import allocation_message, device_message, plugin_options

# Each ListAndWatch stream holds a worker for its whole life. The kubelet keeps one per plugin (two
# for a moment around a re-registration); more are refused, so Allocate always finds free workers.
MAX_STREAMS = 4
# Distinct device-ID requests whose answers are kept per plan; the kubelet asks for few distinct sets.
_ANSWERS_KEPT = 4096


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


class _Answer(Struct, frozen=True):
    """An AllocateResponse and, per container, what the log says: the requested IDs as shown, and
    those that were unhealthy."""

    response: Any
    shown: tuple[str, ...]
    unhealthy: tuple[tuple[str, ...], ...]


class DevicePluginServicer:
    """The DevicePlugin service of one resource; grpc calls the CamelCase methods on its worker threads."""

    def __init__(
        self,
        resource: PlannedResource,
        config: Config,
        inventory: Inventory,
        log: logging.Logger,
        *,
        recorder: Recorder,
        dev_paths_present: Callable[[str], bool] | None = None,
        mig_minors_file: str = MIG_MINORS_FILE,
        cdi_uuid: Callable[[], str] | None = None,
        cdi_classes: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.log = log
        self.recorder = recorder
        self._dev_paths_present = dev_paths_present
        self._mig_minors_file = mig_minors_file
        self._cdi_uuid = cdi_uuid or random_uuid
        self._mig_minors: dict[str, int] | None = None
        self._lock = threading.Condition()
        self._resource = resource
        self._cdi_classes = cdi_classes  # the CDI specs written, for the names Allocate may return
        # Built by the first GetPreferredAllocation after each update, not on the health path.
        self._allocator: PreferredAllocator | None = None
        self._version = 0  # bumped on every update(); streams resend when it moves
        self._delivered = 0  # the newest version a stream has sent in full
        self._answers: dict[tuple[tuple[str, ...], ...], _Answer] = {}  # per plan; see Allocate
        self._list_message: Any = None  # per plan; see _device_list
        self._device_messages: dict[tuple[str, bool, int | None], Any] = {}
        self._streams = 0  # open ListAndWatch streams
        self._closed = False

    @property
    def resource(self) -> PlannedResource:
        with self._lock:
            return self._resource

    def open(self) -> None:
        """Before serving: look up the host's device nodes once, and the MIG minors again."""
        if self._dev_paths_present is None:
            present = present_control_paths(os.path.exists)
            self._dev_paths_present = present.__contains__
        if any(d.is_mig for d in self.resource.devices):
            self._mig_minors = read_mig_minors(self._mig_minors_file, self.log)
        with self._lock:
            self._closed = False

    def close(self) -> None:
        """End every open ListAndWatch stream (the server is stopping)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def update(self, resource: PlannedResource) -> None:
        """Replace the advertised devices (health or sharing changes included); open streams resend."""
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

    def set_cdi_classes(self, classes: frozenset[str]) -> None:
        """The CDI classes whose specs are written now; Allocate answers name no other class."""
        with self._lock:
            if classes != self._cdi_classes:
                self._cdi_classes = classes
                self._answers = {}

    def wait_delivered(self, timeout: float) -> None:
        """Until an open ListAndWatch stream has sent the current list (none open: at once), or `timeout`."""
        with self._lock:
            version = self._version
            self._lock.wait_for(
                lambda: self._delivered >= version or self._streams == 0 or self._closed, timeout
            )

    # -- the service ------------------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return plugin_options()

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
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

    def Allocate(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        # An answer is a pure function of the requested IDs and the plan, so it is computed once per
        # plan (update() starts afresh) - except with CDI annotations, whose key is new every time.
        key = tuple(tuple(container.devices_ids) for container in request.container_requests)
        with self._lock:
            resource, answers, classes = self._resource, self._answers, self._cdi_classes
        answer = answers.get(key)
        if answer is None:
            answer = self._answer(resource, classes, key, context)
            if self._answers_reusable and len(answers) < _ANSWERS_KEPT:
                answers[key] = answer
        for ids, shown, unhealthy in zip(key, answer.shown, answer.unhealthy, strict=True):
            if unhealthy:
                self.log.warning(
                    "Allocate for %s includes unhealthy devices %s", resource.name, list(unhealthy)
                )
            self.log.info("Allocate %s: %s", resource.name, shown)
            self.recorder.allocated(resource.name, len(ids))
        self.recorder.allocate_duration(resource.name, time.perf_counter() - started)
        return answer.response

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
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

    # -- helpers ----------------------------------------------------------------------------------------

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

    def _stream(self, context: Any) -> Iterator[Any]:
        def wake() -> None:
            with self._lock:
                self._lock.notify_all()

        def changed(seen: int) -> bool:
            return self._closed or self._version != seen or not context.is_active()

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
                if self._closed or not context.is_active():
                    return
                # Several updates in between collapse into one: each message is the whole list anyway.
                seen = self._version
                message = self._device_list()

    @property
    def _answers_reusable(self) -> bool:
        return "cdi-annotations" not in self.config.flags.plugin.device_list_strategy

    def _answer(self, resource: PlannedResource, classes: frozenset[str], key: tuple[tuple[str, ...], ...],
                context: Any) -> _Answer:
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
                    cdi_classes=classes,
                )
            except AllocationRefused as err:
                self.recorder.allocation_refused(resource.name, err.reason)
                self.log.warning("Refused Allocate for %s %s: %s", resource.name, shown_ids(ids), err)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                raise  # abort() raises; this keeps type checkers aware of it
            messages.append(allocation_message(allocation))
            unhealthy.append(allocation.unhealthy)
        shown = tuple(shown_ids(ids) for ids in key)
        return _Answer(pb.AllocateResponse(container_responses=messages), shown, tuple(unhealthy))
