"""A small HTTP server for /metrics, /healthz and /readyz (the kubelet's probes, Prometheus' scrapes).

One thread waits in select() on the listening socket, a wake-up pipe and every connection still
sending its request, so an idle endpoint costs nothing between requests and a slow or silent client
holds up no one: each connection must send its whole request within REQUEST_DEADLINE_S of being
accepted or it is closed, and at most MAX_WAITING connections wait at once (the oldest goes first).
A complete request is answered on a thread of its own (at most MAX_ANSWERING at once; beyond that
a 503), since /healthz may take seconds. The listen backlog is the system's maximum, so a flood of
connections does not keep a probe from being accepted.

Why not http.server's ThreadingHTTPServer (the maintained choice in the standard library): its
timeout is per read, so a client sending a byte a second holds a thread as long as it likes (one
thread per such connection, without bound), and in the plugin's process importing and starting it
took 13-24 ms, 40 more modules and 5.8 MiB more peak memory (VmHWM), against 0.3 ms, none and 0.1 MiB
for this module (bench/RESULTS.md, "HTTP endpoints"). prometheus-client's own server is built on it
and also polls twice a second. A thread per answer costs ~0.13 ms of CPU more than answering on the
serving thread did (0.17 ms a request): at the chart's probe periods, 0.002 % of a core.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping

from msgspec import Struct

# A kubelet probe sends its whole request at once; a few seconds is plenty for any honest client.
REQUEST_DEADLINE_S = 3.0
# An answer that cannot be written within this long is given up (the client stopped reading).
WRITE_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 16384
MAX_WAITING = 64
MAX_ANSWERING = 8
TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request",
            500: "Internal Server Error", 503: "Service Unavailable"}


class Response(Struct, frozen=True):
    status: int
    body: bytes
    content_type: str = TEXT


Route = Callable[[], Response]


class AddressError(ValueError):
    """An address flag that is not HOST:PORT."""


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (every interface) or `[IPV6]:PORT` -> (host, port)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise AddressError(f"{text!r} is not an address: use HOST:PORT or :PORT, e.g. :9445 or 0.0.0.0:9445")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port_text)


def _reply(conn: socket.socket, response: Response, head_only: bool) -> None:
    reason = _REASONS.get(response.status, "")
    header = (
        f"HTTP/1.1 {response.status} {reason}\r\nContent-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    conn.sendall(header if head_only else header + response.body)


def _complete(data: bytes) -> bool:
    return b"\r\n\r\n" in data or b"\n\n" in data or len(data) >= MAX_REQUEST_BYTES


class _Waiting:
    """A connection still sending its request."""

    __slots__ = ("conn", "data", "deadline")

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.data = b""
        self.deadline = deadline


class HttpEndpoints:
    """Serves `routes` (path -> handler) on one address until stop()."""

    def __init__(self, address: str, routes: Mapping[str, Route], log: logging.Logger) -> None:
        self.address = address
        self._routes = dict(routes)
        self._log = log
        self._listener: socket.socket | None = None
        self._wake_read, self._wake_write = -1, -1
        self._thread: threading.Thread | None = None
        self._answering = threading.BoundedSemaphore(MAX_ANSWERING)

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        """Bind and listen (errors raise OSError here, in the caller), then serve on a thread."""
        host, port = parse_address(self.address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
            listener.listen(socket.SOMAXCONN)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._serve, name=f"http {self.address}", daemon=True)
        self._thread.start()
        self._log.info("Serving %s on %s", ", ".join(sorted(self._routes)), self.address)

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._wake_write, b"x")
        self._thread.join(5.0)
        self._thread = None
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _serve(self) -> None:
        listener = self._listener
        assert listener is not None
        waiting: dict[int, _Waiting] = {}  # by file descriptor, oldest first
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            try:
                while True:
                    now = time.monotonic()
                    for fd in [fd for fd, w in waiting.items() if w.deadline <= now]:
                        self._drop(selector, waiting, fd, "did not send its request in time")
                    timeout = min((w.deadline for w in waiting.values()), default=now + 3600) - now
                    for key, _ in selector.select(max(timeout, 0.0)):
                        if key.fileobj == self._wake_read:
                            return
                        if key.fileobj is listener:
                            self._accept(listener, selector, waiting)
                        else:
                            self._read(selector, waiting, key.fd)
            finally:
                for fd in list(waiting):
                    self._drop(selector, waiting, fd, "server stopping")

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector,
                waiting: dict[int, _Waiting]) -> None:
        while True:
            try:
                conn, _peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors, or the client gave up already
                self._log.debug("HTTP accept on %s: %s", self.address, err)
                return
            conn.setblocking(False)
            if len(waiting) >= MAX_WAITING:  # make room: the oldest has had the most time
                self._drop(selector, waiting, next(iter(waiting)), "too many connections waiting")
            waiting[conn.fileno()] = _Waiting(conn, time.monotonic() + REQUEST_DEADLINE_S)
            selector.register(conn, selectors.EVENT_READ)

    def _drop(self, selector: selectors.BaseSelector, waiting: dict[int, _Waiting], fd: int,
              why: str) -> None:
        pending = waiting.pop(fd)
        selector.unregister(pending.conn)
        self._log.debug("HTTP client on %s dropped: %s", self.address, why)
        pending.conn.close()

    def _read(self, selector: selectors.BaseSelector, waiting: dict[int, _Waiting], fd: int) -> None:
        pending = waiting[fd]
        try:
            chunk = pending.conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._drop(selector, waiting, fd, str(err))
            return
        if not chunk:
            self._drop(selector, waiting, fd, "closed before sending a request")
            return
        pending.data += chunk
        if not _complete(pending.data):
            return
        del waiting[fd]
        selector.unregister(pending.conn)
        if not self._answering.acquire(blocking=False):
            self._answer(pending.conn, pending.data, Response(503, b"busy; try again\n"))
            return
        threading.Thread(target=self._answer, args=(pending.conn, pending.data), daemon=True,
                         name=f"http {self.address} request").start()

    def _answer(self, conn: socket.socket, data: bytes, busy: Response | None = None) -> None:
        with conn:
            try:
                # The busy answer is written by the serving thread: it must not wait on the client.
                conn.settimeout(WRITE_TIMEOUT_S if busy is None else 0.0)
                self._handle(conn, data.split(b"\n", 1)[0].decode("latin-1").strip(), busy)
            except OSError as err:  # the client went away: nothing to answer
                self._log.debug("HTTP client on %s: %s", self.address, err)
            finally:
                if busy is None:
                    self._answering.release()

    def _handle(self, conn: socket.socket, request_line: str, busy: Response | None) -> None:
        parts = request_line.split()
        if len(parts) < 2:
            _reply(conn, Response(400, b"bad request\n"), False)
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            _reply(conn, Response(405, b"only GET and HEAD\n"), False)
            return
        if busy is not None:
            _reply(conn, busy, method == "HEAD")
            return
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            known = " ".join(sorted(self._routes))
            _reply(conn, Response(404, f"not found; try {known}\n".encode()), method == "HEAD")
            return
        try:
            response = route()
        except Exception:  # a failing handler must not end the server
            self._log.exception("HTTP handler for %s failed", target)
            response = Response(500, b"internal error; see the plugin log\n")
        _reply(conn, response, method == "HEAD")


def start_endpoints(metrics_address: str | None, health_address: str | None, probes: Mapping[str, Route],
                    metrics: Route, log: logging.Logger) -> list[HttpEndpoints]:
    """The servers a daemon's flags ask for: the probes and `/metrics` on `metrics_address`, the probes
    alone on `health_address` (one server when both are the same). OSError (a port taken) propagates
    with the address in it, after the servers already started are stopped."""
    wanted: dict[str, dict[str, Route]] = {}
    if metrics_address:
        wanted[metrics_address] = {**probes, "/metrics": metrics}
    if health_address:
        wanted.setdefault(health_address, {}).update(probes)
    servers: list[HttpEndpoints] = []
    try:
        for address, routes in wanted.items():
            server = HttpEndpoints(address, routes, log)
            try:
                server.start()
            except OSError as err:
                raise OSError(f"cannot listen on {address}: {err.strerror or err}") from err
            servers.append(server)
    except OSError:
        for server in servers:
            server.stop()
        raise
    return servers
