"""The DRA kubelet plugin's gRPC edge: the DRAPlugin service (v1 and v1beta1) and plugin registration.

The kubelet finds the plugin through `<registry_dir>/<driver>-reg.sock` (its plugin watcher), asks
GetInfo there, and then calls NodePrepareResources / NodeUnprepareResources on the endpoint GetInfo
names, `<plugin_dir>/dra.sock`. With an instance name (the pod's UID) the two are
`<driver>-<instance>-reg.sock` and `dra-<instance>.sock`: the kubelet (1.33 and later) then keeps the
registrations of two instances of one driver side by side and calls the newest, so a DaemonSet that
surges serves without a gap while the old pod finishes its calls (kubelet's pluginwatcher README,
"Seamless Upgrade"; the DRA helper's `RollingUpdate` option names them the same way). This module turns
those calls into plain records (`ClaimRef`) for the `prepare` / `unprepare` callbacks and their answers
back into messages; it holds no claim state.

Each socket has a gRPC server of its own (sharing one thread pool): gRPC cannot add a listening
socket to a server that already runs, and a registration socket removed behind the plugin's back
(a kubelet restart cleans its registry folder) must be made again without interrupting prepare
calls in flight on the DRA socket. Sockets are bound under a private name and renamed into place
(`nvdp.daemon.owned_socket`), so the DRA socket accepts calls before the registration socket
appears, and a stale socket from an earlier instance is replaced in one step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from types import ModuleType
from typing import Any

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.owned_socket import OwnedSocket, ServerStartError, accepts
from nvdp.daemon.report.recording import Recorder
from nvdp.dra.claims.causes import INTERNAL, PREPARE_CAUSES, UNPREPARE_DEVICES, cause_of
from nvdp.dra.claims.records import ClaimRef, PrepareResult
from nvdp.dra.kubelet.api import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_v1_pb2
from nvdp.dra.kubelet.api import dra_v1_pb2_grpc as _dra_v1_grpc
from nvdp.dra.kubelet.api import dra_v1beta1_pb2_grpc as _dra_v1beta1_grpc
from nvdp.dra.kubelet.api import pluginregistration_v1_pb2_grpc as _registration_grpc
from nvdp.dra.kubelet.health_service import HealthFeed, add_health_services
from nvdp.dra.kubelet.meter import PREPARE, UNPREPARE, Meter, Prepared

# The generated service modules have no type hints.
dra_v1_grpc: Any = _dra_v1_grpc
dra_v1beta1_grpc: Any = _dra_v1beta1_grpc
registration_grpc: Any = _registration_grpc
registration_pb: Any = pluginregistration_v1_pb2

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
PLUGIN_SOCKET = "dra.sock"
# What the kubelet gives a pod as metadata.uid: only such instance names are taken for this plugin's.
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

_WORKERS = 8
# Calls beyond this (running and queued) are refused at once instead of queueing without bound.
_MAX_CONCURRENT_RPCS = 64
_STOP_GRACE_S = 1.0


Prepare = Callable[[Sequence[ClaimRef]], dict[str, PrepareResult]]  # keyed by claim uid
Unprepare = Callable[[Sequence[ClaimRef]], dict[str, str]]  # claim uid -> error ("" = done)


def _instance_in(name: str, prefix: str, suffix: str) -> str:
    """The pod UID in a socket name `<prefix><pod UID><suffix>`; "" for any other name."""
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return ""
    middle = name[len(prefix):len(name) - len(suffix)]
    return middle if _POD_UID.fullmatch(middle) else ""


def remove_dead_instances(folder: str, prefix: str, suffix: str, keep: str) -> list[str]:
    """Remove the sockets `<prefix><pod UID><suffix>` in `folder` that nothing serves (left by an
    instance that was killed); a live instance's socket, `keep`, and any other name (another driver's,
    whose name may start the same) stay. The removed paths."""
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(folder, name)
        if path == keep or not _instance_in(name, prefix, suffix):
            continue
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            accepts(path)
        except FileNotFoundError:
            continue
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(path)
    return removed


def newest_instance(registry_dir: str, driver: str) -> str:
    """The pod UID of the newest registration socket `<driver>-<pod UID>-reg.sock` in `registry_dir`
    (a rolling update's new pod); "" when there is none (the fixed names are in use)."""
    prefix, suffix = f"{driver}-", "-reg.sock"
    found: list[tuple[float, str]] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(registry_dir):
            uid = _instance_in(name, prefix, suffix)
            if uid:
                with contextlib.suppress(OSError):
                    found.append((os.lstat(os.path.join(registry_dir, name)).st_mtime, uid))
    return max(found)[1] if found else ""


def plugin_socket_path(plugin_dir: str, instance: str = "") -> str:
    return os.path.join(plugin_dir, f"dra-{instance}.sock" if instance else PLUGIN_SOCKET)


def registration_socket_path(registry_dir: str, driver: str, instance: str = "") -> str:
    return os.path.join(registry_dir, f"{driver}-{instance}-reg.sock" if instance else f"{driver}-reg.sock")


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def _error_text(err: Exception) -> str:
    return str(err) or type(err).__name__


class _DraServicer:
    """NodePrepareResources / NodeUnprepareResources of one DRA API version (`api`: its messages).

    Every claim of a request gets an entry in the answer: a failure, an exception in the callback
    included, is that claim's `error`, which the kubelet retries; a gRPC error status would fail
    the whole call.
    """

    def __init__(self, api: ModuleType, prepare: Prepare, unprepare: Unprepare, log: logging.Logger,
                 meter: Meter) -> None:
        self._api: Any = api
        self._prepare = prepare
        self._unprepare = unprepare
        self._log = log
        self._meter = meter

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        refs = _refs(request.claims)
        causes = [INTERNAL] * len(refs)  # until answered
        started = self._meter.begin(PREPARE, len(refs))
        try:
            try:
                results = self._prepare(refs)
            except Exception as err:
                self._log.error("Preparing claims %s failed: %s", [r.uid for r in refs], err)
                results = {ref.uid: PrepareResult(error=f"preparing failed: {_error_text(err)}",
                                                  cause=cause_of(err)) for ref in refs}
            response = self._api.NodePrepareResourcesResponse()
            for i, ref in enumerate(refs):
                result = results.get(ref.uid)
                if result is None:
                    result = PrepareResult(error=f"the driver gave no answer for claim {ref.uid}; retry")
                entry = response.claims[ref.uid]
                if result.error:
                    entry.error = result.error
                    causes[i] = result.cause if result.cause in PREPARE_CAUSES else INTERNAL
                    continue
                for device in result.devices:
                    # share_id (v1 only) stays unset: devices are not shared between claims.
                    entry.devices.add(
                        request_names=list(device.request_names),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=list(device.cdi_ids),
                    )
                causes[i] = ""
            return response
        finally:
            self._meter.end(PREPARE, started, causes)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        refs = _refs(request.claims)
        causes = [INTERNAL] * len(refs)
        started = self._meter.begin(UNPREPARE, len(refs))
        try:
            try:
                errors = self._unprepare(refs)
            except Exception as err:
                self._log.error("Unpreparing claims %s failed: %s", [r.uid for r in refs], err)
                errors = {ref.uid: f"unpreparing failed: {_error_text(err)}" for ref in refs}
            else:
                causes = [UNPREPARE_DEVICES] * len(refs)
            response = self._api.NodeUnprepareResourcesResponse()
            for i, ref in enumerate(refs):
                error = errors.get(ref.uid)
                if error is None:
                    error = f"the driver gave no answer for claim {ref.uid}; retry"
                    causes[i] = INTERNAL
                entry = response.claims[ref.uid]
                if error:
                    entry.error = error
                else:
                    causes[i] = ""
            return response
        finally:
            self._meter.end(UNPREPARE, started, causes)


class _RegistrationServicer:
    """The plugin watcher's side: what this plugin is, and whether the kubelet took it."""

    def __init__(self, info: Any, on_status: Callable[[bool, str], None]) -> None:
        self._info = info
        self._on_status = on_status

    def GetInfo(self, request: Any, context: Any) -> Any:
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._on_status(request.plugin_registered, request.error)
        return registration_pb.RegistrationStatusResponse()


class _KubeletSocket(OwnedSocket):
    """An OwnedSocket whose errors speak of the kubelet folder it belongs in."""

    def __init__(self, path: str, what: str, setting: str) -> None:
        super().__init__(path, what)
        self._what = what
        self._setting = setting

    def prepare(self) -> str:
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISSOCK(mode):
            raise ServerStartError(f"{self.path} exists and is not a socket; remove it or choose another "
                                   f"{self._setting}")
        return super().prepare()

    def listen_error(self, cause: str) -> str:
        return (f"cannot listen on {self.path} for {self._what}: {cause}; check that the directory exists, "
                f"is writable by the plugin and is the kubelet's folder for it ({self._setting})")


class _Listener:
    """One gRPC server on one kubelet socket; started and stopped as a unit."""

    def __init__(self, socket: _KubeletSocket, add_services: Callable[[grpc.Server], None],
                 executor: futures.ThreadPoolExecutor) -> None:
        self.socket = socket
        self._add_services = add_services
        self._executor = executor
        self._server: grpc.Server | None = None

    @property
    def path(self) -> str:
        return self.socket.path

    def start(self) -> None:
        """Serve on a private name, rename it into place, and confirm the path accepts connections."""
        bound = self.socket.prepare()
        server = grpc.server(self._executor, maximum_concurrent_rpcs=_MAX_CONCURRENT_RPCS)
        self._add_services(server)
        try:
            port = server.add_insecure_port(f"unix://{bound}")
        except RuntimeError as err:
            raise ServerStartError(self.socket.listen_error(str(err))) from err
        if port == 0:
            raise ServerStartError(self.socket.listen_error("gRPC could not bind it"))
        server.start()
        old, self._server = self._server, server
        try:
            self.socket.take_place(bound)
            accepts(self.path)
        except (OSError, ServerStartError) as err:
            self.stop()
            if isinstance(err, ServerStartError):
                raise
            raise ServerStartError(self.socket.listen_error(f"no connection after starting: {err}")) from None
        finally:
            # A server being replaced lost its path already; calls in flight on it may finish.
            if old is not None:
                old.stop(grace=_STOP_GRACE_S).wait()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=_STOP_GRACE_S).wait()
        self.socket.remove_if_ours()

    def running(self) -> bool:
        return self._server is not None


class DraServer:
    """Serves the DRA plugin API and plugin registration to the kubelet. Thread-safe."""

    def __init__(
        self, *, driver: str, plugin_dir: str, registry_dir: str, prepare: Prepare, unprepare: Unprepare,
        log: logging.Logger, on_registered: Callable[[bool, str], None] | None = None,
        recorder: Recorder | None = None,
        node: str = "", prepared: Prepared | None = None, health: HealthFeed | None = None,
        instance: str = "",
    ) -> None:
        """`recorder` counts and times the kubelet's calls; `prepared` lists the claims prepared now
        (for the prepared-devices gauge of `node`); `health`, when given, is served as the kubelet's
        DRAResourceHealth service (every version) on the DRA socket; `instance` (the pod's UID) names
        the sockets of this instance, for a rolling update beside another."""
        self.driver = driver
        self.plugin_socket = plugin_socket_path(plugin_dir, instance)
        self.registration_socket = registration_socket_path(registry_dir, driver, instance)
        self._instance = instance
        self._dirs = (plugin_dir, registry_dir)
        self._log = log
        self._on_registered = on_registered
        self._lock = threading.Lock()
        self._registered = False
        self._executor: futures.ThreadPoolExecutor | None = None
        info = registration_pb.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=self.plugin_socket, supported_versions=SUPPORTED_VERSIONS
        )
        self._meter = Meter(recorder or Recorder(), driver, node, prepared)
        v1 = _DraServicer(dra_v1_pb2, prepare, unprepare, log, self._meter)
        v1beta1 = _DraServicer(dra_v1beta1_pb2, prepare, unprepare, log, self._meter)
        registration = _RegistrationServicer(info, self._registration_status)

        def add_dra(server: grpc.Server) -> None:
            dra_v1_grpc.add_DRAPluginServicer_to_server(v1, server)
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(v1beta1, server)
            if health is not None:
                add_health_services(server, health)

        def add_registration(server: grpc.Server) -> None:
            registration_grpc.add_RegistrationServicer_to_server(registration, server)

        self._add_dra = add_dra
        self._add_registration = add_registration
        self._dra: _Listener | None = None
        self._reg: _Listener | None = None

    def start(self) -> None:
        """Serve DRA on the plugin socket, then open the registration socket (the kubelet's cue)."""
        with self._lock:
            if self._executor is not None:
                raise RuntimeError(f"the DRA server for {self.driver} is already started")
            self._executor = futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nvdp-dra")
            self._dra = _Listener(
                _KubeletSocket(self.plugin_socket, f"DRA driver {self.driver}", "the kubelet plugins folder"),
                self._add_dra, self._executor,
            )
            self._reg = _Listener(
                _KubeletSocket(self.registration_socket, f"the registration of DRA driver {self.driver}",
                               "the kubelet plugin registry folder"),
                self._add_registration, self._executor,
            )
            if self._instance:
                # Sockets of instances that were killed: nothing serves them, the kubelet's watcher
                # keeps trying them. A live instance (a rolling update's other pod) is left alone.
                for path in (*remove_dead_instances(self._dirs[0], "dra-", ".sock", self.plugin_socket),
                             *remove_dead_instances(self._dirs[1], f"{self.driver}-", "-reg.sock",
                                                    self.registration_socket)):
                    self._log.info("Removed %s: left by an instance of this plugin that no longer runs", path)
            try:
                self._dra.start()
                self._log.info("Serving DRA driver %s (%s) on %s", self.driver, ", ".join(SUPPORTED_VERSIONS),
                               self.plugin_socket)
                self._reg.start()
            except Exception:
                self._stop_locked()
                raise
            self._log.info("Registration socket for %s at %s", self.driver, self.registration_socket)
        self._meter.serving()

    def registered(self) -> bool:
        """Whether the kubelet's last NotifyRegistrationStatus said the plugin is registered."""
        with self._lock:
            return self._registered

    def check_sockets(self) -> bool:
        """True when both socket paths still hold the sockets this server made.

        A socket removed (or replaced by one nobody serves) is made again, the DRA socket before the
        registration socket; a socket another live instance serves is left to it. Both cases answer
        False. Raises ServerStartError when a socket cannot be made again.
        """
        with self._lock:
            if self._dra is None or self._reg is None:
                return False
            intact = True
            for listener in (self._dra, self._reg):
                state = listener.socket.state()
                if state == "ours":
                    continue
                intact = False
                if state == "taken":
                    self._log.warning("%s is served by another process now; leaving it to that process",
                                      listener.path)
                    continue
                why = "was removed" if state == "gone" else "was replaced by a socket nobody serves"
                self._log.info("%s %s; serving it again", listener.path, why)
                if listener is self._reg:
                    # A new registration socket is a new registration: wait for the kubelet's answer.
                    self._registered = False
                listener.start()
            return intact

    def stop(self) -> None:
        """Stop serving and remove both sockets (removing the registration socket deregisters). Safe twice."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        # Registration first: the kubelet should stop calling before the DRA socket goes away.
        for listener in (self._reg, self._dra):
            if listener is not None:
                listener.stop()
        self._reg = self._dra = None
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
        self._registered = False

    def _registration_status(self, registered: bool, error: str) -> None:
        with self._lock:
            self._registered = registered
        if registered:
            self._log.info("Registered with the kubelet as DRA driver %s", self.driver)
        else:
            self._log.error("The kubelet did not register DRA driver %s: %s", self.driver,
                            error or "no reason given")
        if self._on_registered is None:
            return
        try:
            self._on_registered(registered, error)
        except Exception as err:  # the kubelet's call must still succeed
            self._log.error("Handling the registration status failed: %s", err)
