"""A small HTTP server for /metrics, /healthz and /readyz (the kubelet's probes, Prometheus' scrapes).

Deliberately not http.server (about 45 ms and a few MiB to import, paid by every plugin start) and
not prometheus-client's own server (which polls twice a second): one thread blocks in select() on
the listening socket and a wake-up pipe, so an idle endpoint costs nothing between requests.
Requests are answered one at a time on that thread; each is small (a probe or a scrape), and a
client that does not send its request within the read timeout is dropped.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Mapping

from msgspec import Struct

READ_TIMEOUT_S = 2.0
MAX_REQUEST_BYTES = 16384
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


def _read_request_line(conn: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data and len(data) < MAX_REQUEST_BYTES:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("latin-1").strip()


class HttpEndpoints:
    """Serves `routes` (path -> handler) on one address until stop()."""

    def __init__(self, address: str, routes: Mapping[str, Route], log: logging.Logger) -> None:
        self.address = address
        self._routes = dict(routes)
        self._log = log
        self._listener: socket.socket | None = None
        self._wake_read, self._wake_write = -1, -1
        self._thread: threading.Thread | None = None

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
            listener.listen(16)
        except OSError:
            listener.close()
            raise
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
        while True:
            ready, _, _ = select.select([listener.fileno(), self._wake_read], [], [])
            if self._wake_read in ready:
                return
            try:
                conn, _peer = listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    self._handle(conn)
                except OSError as err:  # the client went away: nothing to answer
                    self._log.debug("HTTP client on %s: %s", self.address, err)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(READ_TIMEOUT_S)
        parts = _read_request_line(conn).split()
        if len(parts) < 2:
            _reply(conn, Response(400, b"bad request\n"), False)
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            _reply(conn, Response(405, b"only GET and HEAD\n"), False)
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
