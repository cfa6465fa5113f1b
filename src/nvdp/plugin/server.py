"""One kubelet device-plugin gRPC server per planned resource, on `<device_plugin_path>/nvidia-<name>.sock`.

A RunningResource makes a ResourceServer, calls start() and register(), feeds device-list changes
through update(), asks `socket_state()` whether its socket is still in place, and calls stop() on
shutdown or restart. This module only ties the parts together: the RPC bodies (`servicer`), the
socket's ownership (`owned_socket`), the Register call (`grpc_client`) and the messages (`wire`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent import futures

from nvdp.config.model import Config
from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.owned_socket import OwnedSocket, ServerStartError, SocketState, accepts
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedResource
from nvdp.plugin import grpc_client
from nvdp.plugin.allocate import MIG_MINORS_FILE
from nvdp.plugin.servicer import DevicePluginServicer
from nvdp.plugin.wire import pb_grpc

_WORKERS = 8
# Calls beyond this (running and queued) are refused at once instead of queueing without bound.
_MAX_CONCURRENT_RPCS = 64
_STOP_GRACE_S = 1.0


def socket_path_for(resource: PlannedResource, config: Config) -> str:
    """A resource's socket in the kubelet's device-plugins folder."""
    return os.path.join(config.flags.plugin.device_plugin_path, f"nvidia-{resource.short_name}.sock")


class ResourceServer:
    """Serves one resource to the kubelet. Thread-safe: update() may be called from any thread."""

    def __init__(
        self,
        resource: PlannedResource,
        config: Config,
        inventory: Inventory,
        *,
        logger: logging.Logger | None = None,
        recorder: Recorder | None = None,
        dev_paths_present: Callable[[str], bool] | None = None,
        mig_minors_file: str = MIG_MINORS_FILE,
        cdi_uuid: Callable[[], str] | None = None,
        cdi_classes: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.log = logger or logging.getLogger(__name__)
        # None: a Recorder of its own: records nowhere but its metrics.
        self.recorder = recorder if recorder is not None else Recorder()
        self.socket_path = socket_path_for(resource, config)
        self.service = DevicePluginServicer(
            resource, config, inventory, self.log, recorder=self.recorder,
            dev_paths_present=dev_paths_present, mig_minors_file=mig_minors_file, cdi_uuid=cdi_uuid,
            cdi_classes=cdi_classes,
        )
        self._socket = OwnedSocket(self.socket_path, resource.name)
        self._server: grpc.Server | None = None
        self._announced = False  # "Starting GRPC server" is logged once, not on every retry

    @property
    def resource(self) -> PlannedResource:
        return self.service.resource

    def start(self) -> None:
        """Listen on the socket (replacing a stale one) and confirm by connecting to it."""
        name = self.service.resource.name
        if self._server is not None:
            raise RuntimeError(f"the server for {name} is already started")
        self.service.open()
        if not self._announced:
            self.log.info("Starting GRPC server for '%s'", name)
            self._announced = True
        bound = self._socket.prepare()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nvdp-grpc"),
            maximum_concurrent_rpcs=_MAX_CONCURRENT_RPCS,
        )
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        try:
            port = server.add_insecure_port(f"unix://{bound}")
        except RuntimeError as err:
            raise ServerStartError(self._socket.listen_error(str(err))) from err
        if port == 0:
            raise ServerStartError(self._socket.listen_error("gRPC could not bind it"))
        server.start()
        self._server = server
        try:
            self._socket.take_place(bound)
        except ServerStartError:
            self.stop()
            raise
        try:
            accepts(self.socket_path)
        except OSError as err:
            self.stop()
            cause = f"does not accept connections on {self.socket_path} after starting: {err.strerror or err}"
            raise ServerStartError(f"the server for {name} {cause}") from None
        self.log.info("Starting to serve '%s' on %s", name, self.socket_path)

    def register(self, kubelet_socket: str, timeout: float = 5.0) -> None:
        """Announce this resource to the kubelet's Registration service."""
        name = self.service.resource.name
        if self._server is None:
            raise grpc_client.RegistrationError(f"cannot register {name}: start() the server first")
        endpoint = os.path.basename(self.socket_path)
        grpc_client.register(kubelet_socket, name, endpoint, timeout, self.log, self.recorder)

    def update(self, resource: PlannedResource) -> None:
        """Replace the advertised devices (health changes included); every open stream resends the list."""
        self.service.update(resource)

    def set_cdi_classes(self, classes: frozenset[str]) -> None:
        """The CDI classes whose specs are written now (see DevicePluginServicer.set_cdi_classes)."""
        self.service.set_cdi_classes(classes)

    def wait_delivered(self, timeout: float) -> None:
        """Until an open ListAndWatch stream has sent the current list (none open: at once), or `timeout`."""
        self.service.wait_delivered(timeout)

    def socket_state(self) -> SocketState:
        """Whether the socket we put in place is still there (see OwnedSocket.state)."""
        return self._socket.state()

    def stop(self) -> None:
        """End the streams, stop serving and remove the socket. Safe to call twice."""
        self.service.close()
        server, self._server = self._server, None
        if server is not None:
            self.log.info("Stopping to serve '%s' on %s", self.service.resource.name, self.socket_path)
            server.stop(grace=_STOP_GRACE_S).wait()
        self._socket.remove_if_ours()
