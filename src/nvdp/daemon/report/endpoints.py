"""A small HTTP server for /metrics, /healthz and /readyz (the kubelet's probes, Prometheus' scrapes).

One thread waits in epoll on the listening socket, a wake-up pipe and every connection still sending
its request, so an idle endpoint costs nothing between requests and a slow or silent client holds up
no one: each connection must send its whole request within REQUEST_DEADLINE_S of being accepted or
it is closed, and at most MAX_WAITING connections wait at once (the oldest goes first). A request
that is already there when its connection is accepted (any honest client's) is read at once, so it
never waits in that line. A complete request for a route is queued for that route's own answering
threads (at most ANSWERERS_PER_ROUTE at once, started on demand, at most QUEUED_PER_ROUTE waiting,
beyond that a 503), so a storm of scrapes cannot take the threads the probes need, and a /healthz
that takes seconds delays no scrape. Malformed requests are answered 400 (405, 404) by the serving
thread without waiting on the client. The listen backlog is the system's maximum.

The serving thread must not die quietly: a connection whose handling fails is closed and logged at
ERROR with its traceback; anything else that ends the thread closes the listening socket (probes to
that address are refused at once, so the kubelet restarts the pod), is logged at ERROR with its cause
and calls `on_death` (both plugins end their process with it, through nvdp.daemon.guard; the MPS daemon
through its run loop).

Why not a maintained server (bench/endpoints_bench.py; bench/RESULTS.md, "HTTP endpoints under load"):
500 scrapes 100 at a time, 10 slowloris clients and malformed requests, same 2-core machine, same run.
This server answered every scrape and every probe (max 8 ms), closed each slowloris connection at
3 s and peaked at 4 threads. http.server's ThreadingHTTPServer (the base of prometheus-client's own
server) answered all too (probes max 21-165 ms) but never closed a slowloris connection (its timeout
is per read), holds a thread per connection without bound (15-17 at the peak), answers garbage with
a status-less HTTP/0.9 body, and in a probes-only plugin importing and starting it adds 34 modules,
5.3 MiB of peak memory and 14-18 ms, against 0, 0.08 MiB and 0.3-0.9 ms. waitress 3.0 (a new
dependency) failed 2 of 7 probes each round (5 s timeouts: the slowloris clients and the storm fill
its 100 connections) and held every slowloris connection for the whole run.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

from msgspec import Struct

# A kubelet probe sends its whole request at once; a few seconds is plenty for any honest client.
REQUEST_DEADLINE_S = 3.0
# An answer that cannot be written within this long is given up (the client stopped reading).
WRITE_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 16384
MAX_WAITING = 128
ANSWERERS_PER_ROUTE = 4
QUEUED_PER_ROUTE = 128
TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request",
            500: "Internal Server Error", 503: "Service Unavailable"}


class Response(Struct, frozen=True):
    status: int
    body: bytes
    content_type: str = TEXT


Route = Callable[[], Response]
OnDeath = Callable[[str], None]


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


def _encode(response: Response, head_only: bool) -> bytes:
    reason = _REASONS.get(response.status, "")
    header = (
        f"HTTP/1.1 {response.status} {reason}\r\nContent-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    return header if head_only else header + response.body


def _complete(data: bytes) -> bool:
    return b"\r\n\r\n" in data or b"\n\n" in data or len(data) >= MAX_REQUEST_BYTES


class _Waiting:
    """What a connection still sending its request has sent, and until when it may."""

    __slots__ = ("data", "deadline")

    def __init__(self, deadline: float) -> None:
        self.data = b""
        self.deadline = deadline


class _Answerers:
    """One route's requests waiting for an answer, and the threads (started on demand) answering them."""

    def __init__(self, name: str, answer: Callable[[socket.socket, bool], None]) -> None:
        self._name = name
        self._answer = answer
        self._lock = threading.Lock()
        self._queue: deque[tuple[socket.socket, bool]] = deque()
        self._threads = 0

    def offer(self, conn: socket.socket, head_only: bool) -> bool:
        """Queue a request; False when the route is too busy to take it."""
        with self._lock:
            if len(self._queue) >= QUEUED_PER_ROUTE:
                return False
            self._queue.append((conn, head_only))
            if self._threads >= ANSWERERS_PER_ROUTE:
                return True
            self._threads += 1
        try:
            threading.Thread(target=self._drain, name=self._name, daemon=True).start()
        except RuntimeError:  # no thread to be had: a running one drains the queue, else refuse
            with self._lock:
                self._threads -= 1
                if self._threads == 0:
                    self._queue.remove((conn, head_only))
                    return False
        return True

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._threads -= 1
                    return
                conn, head_only = self._queue.popleft()
            self._answer(conn, head_only)


class HttpEndpoints:
    """Serves `routes` (path -> handler) on one address until stop(); `on_death(what)` is called if the
    serving thread ever fails (its cause is logged first)."""

    def __init__(self, address: str, routes: Mapping[str, Route], log: logging.Logger,
                 on_death: OnDeath | None = None) -> None:
        self.address = address
        self._routes = dict(routes)
        self._log = log
        self._on_death = on_death
        self._listener: socket.socket | None = None
        self._port = 0
        self._wake_read, self._wake_write = -1, -1
        self._thread: threading.Thread | None = None
        self._answerers = {path: _Answerers(f"http {address} {path}", self._answerer(route))
                           for path, route in self._routes.items()}
        self.failure: str | None = None  # why the serving thread ended, if it did

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return self._port

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
        self._port = int(listener.getsockname()[1])
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
        waiting: dict[socket.socket, _Waiting] = {}  # oldest first
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(listener, selectors.EVENT_READ)
                selector.register(self._wake_read, selectors.EVENT_READ)
                try:
                    self._loop(listener, selector, waiting)
                finally:
                    for conn in list(waiting):
                        self._drop(selector, waiting, conn, "server stopping")
        except BaseException as err:
            self._died(listener, err)

    def _died(self, listener: socket.socket, err: BaseException) -> None:
        what = f"The HTTP server on {self.address}"
        self.failure = f"{type(err).__name__}: {err}"
        listener.close()  # refused from now on: a probe fails at once instead of timing out
        self._log.error("%s stopped (%s): its %s go unanswered", what, self.failure,
                        ", ".join(sorted(self._routes)), exc_info=err)
        if self._on_death is not None:
            self._on_death(what)

    def _loop(self, listener: socket.socket, selector: selectors.BaseSelector,
              waiting: dict[socket.socket, _Waiting]) -> None:
        while True:
            now = time.monotonic()
            for late in [conn for conn, w in waiting.items() if w.deadline <= now]:
                self._drop(selector, waiting, late, "did not send its request in time")
            timeout = min((w.deadline for w in waiting.values()), default=now + 3600) - now
            for key, _ in selector.select(max(timeout, 0.0)):
                if key.fileobj == self._wake_read:
                    return
                if key.fileobj is listener:
                    self._accept(listener, selector, waiting)
                    continue
                # Dropped earlier in this same batch (to make room, by a failure): nothing to read.
                if isinstance(key.fileobj, socket.socket) and key.fileobj in waiting:
                    self._read_guarded(selector, waiting, key.fileobj)

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector,
                waiting: dict[socket.socket, _Waiting]) -> None:
        while True:
            try:
                conn, _peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors, or the client gave up already
                self._log.debug("HTTP accept on %s: %s", self.address, err)
                if err.errno in (errno.EMFILE, errno.ENFILE) and waiting:
                    self._drop(selector, waiting, next(iter(waiting)), "out of file descriptors")
                return
            conn.setblocking(False)
            if len(waiting) >= MAX_WAITING:  # make room: the oldest has had the most time
                self._drop(selector, waiting, next(iter(waiting)), "too many connections waiting")
            waiting[conn] = _Waiting(time.monotonic() + REQUEST_DEADLINE_S)
            selector.register(conn, selectors.EVENT_READ)
            self._read_guarded(selector, waiting, conn)  # an honest client's request is already here

    def _drop(self, selector: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting],
              conn: socket.socket, why: str) -> None:
        del waiting[conn]
        selector.unregister(conn)
        self._log.debug("HTTP client on %s dropped: %s", self.address, why)
        conn.close()

    def _read_guarded(self, selector: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting],
                      conn: socket.socket) -> None:
        try:
            self._read(selector, waiting, conn)
        except Exception:  # a defect met by one connection: close it, serve the others
            self._log.exception("HTTP server on %s failed on a request; closed that connection", self.address)
            if conn in waiting:
                self._drop(selector, waiting, conn, "failed")
            else:
                conn.close()

    def _read(self, selector: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting],
              conn: socket.socket) -> None:
        pending = waiting[conn]
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._drop(selector, waiting, conn, str(err))
            return
        if not chunk:
            self._drop(selector, waiting, conn, "closed before sending a request")
            return
        pending.data += chunk
        if not _complete(pending.data):
            return
        del waiting[conn]
        selector.unregister(conn)
        self._dispatch(conn, pending.data.split(b"\n", 1)[0].decode("latin-1").split())

    def _dispatch(self, conn: socket.socket, request_line: list[str]) -> None:
        """Queue a request for its route's answerers, or answer it here without waiting on the client."""
        if len(request_line) < 2:
            self._answer_now(conn, Response(400, b"bad request\n"), False)
            return
        method, target = request_line[0], request_line[1]
        if not (method.isascii() and method.isalpha()) or not target.startswith("/"):
            self._answer_now(conn, Response(400, b"bad request\n"), False)
            return
        if method not in ("GET", "HEAD"):
            self._answer_now(conn, Response(405, b"only GET and HEAD\n"), False)
            return
        answerers = self._answerers.get(target.split("?", 1)[0])
        if answerers is None:
            known = " ".join(sorted(self._routes))
            self._answer_now(conn, Response(404, f"not found; try {known}\n".encode()), method == "HEAD")
        elif not answerers.offer(conn, method == "HEAD"):
            self._answer_now(conn, Response(503, b"busy; try again\n"), method == "HEAD")

    def _answer_now(self, conn: socket.socket, response: Response, head_only: bool) -> None:
        with conn:
            try:
                conn.send(_encode(response, head_only))  # non-blocking: what the buffer takes
            except OSError as err:
                self._log.debug("HTTP client on %s: %s", self.address, err)

    def _answerer(self, route: Route) -> Callable[[socket.socket, bool], None]:
        def answer(conn: socket.socket, head_only: bool) -> None:
            with conn:
                try:
                    response = route()
                except Exception:  # a failing handler must not end the server
                    self._log.exception("HTTP handler on %s failed", self.address)
                    response = Response(500, b"internal error; see the log\n")
                try:
                    conn.settimeout(WRITE_TIMEOUT_S)
                    conn.sendall(_encode(response, head_only))
                except OSError as err:  # the client went away or stopped reading: nothing to answer
                    self._log.debug("HTTP client on %s: %s", self.address, err)
                except Exception:  # a defect: this answer is lost, the route's next ones are not
                    self._log.exception("HTTP server on %s could not answer a request", self.address)

        return answer


def start_endpoints(metrics_address: str | None, health_address: str | None, probes: Mapping[str, Route],
                    metrics: Route, log: logging.Logger, on_death: OnDeath | None = None
                    ) -> list[HttpEndpoints]:
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
            server = HttpEndpoints(address, routes, log, on_death)
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
