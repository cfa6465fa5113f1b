"""The HTTP server survives what a load probe threw at it, and its death cannot go unnoticed.

Counts, not durations: every request gets an answer, every probe during a storm is answered 200, a
probe afterwards is answered. Client sockets time out only to turn a hang into a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nvdp.daemon.report import endpoints
from nvdp.daemon.report.endpoints import HttpEndpoints, Response

LOG = logging.getLogger("test.http")
HANG_S = 20  # a client that waits longer than this has met a hung server
METRICS = b"# HELP nvdp_devices devices\n" + b"nvdp_devices{resource=\"nvidia.com/gpu\"} 32.0\n" * 200


def routes() -> dict[str, endpoints.Route]:
    return {"/metrics": lambda: Response(200, METRICS), "/healthz": lambda: Response(200, b"live\n"),
            "/readyz": lambda: Response(200, b"ready\n")}


@pytest.fixture
def server() -> Iterator[HttpEndpoints]:
    served = HttpEndpoints("127.0.0.1:0", routes(), LOG)
    served.start()
    yield served
    served.stop()


def raw(port: int, request: bytes) -> str:
    """What the server answered, '' if it closed the connection without an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as conn:
        try:
            conn.sendall(request)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        except ConnectionResetError:
            return ""
    return data.decode("latin-1")


def status(port: int, path: str) -> int:
    answer = raw(port, f"GET {path} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
    return int(answer.split(" ", 2)[1]) if answer.startswith("HTTP/1.1 ") else 0


class Stepped(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """A selector whose select() waits for the test's turn, so that events pile up into one batch."""

    turns = threading.Semaphore(0)
    ready = threading.Semaphore(0)  # one release each time the server is back in select()

    def select(self, timeout: float | None = None) -> Any:
        self.ready.release()
        assert self.turns.acquire(timeout=HANG_S)
        return super().select(timeout)


def test_a_connection_dropped_to_make_room_is_skipped_later_in_the_same_batch(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(endpoints, "MAX_WAITING", 2)
    monkeypatch.setattr(selectors, "DefaultSelector", Stepped)
    Stepped.turns, Stepped.ready = threading.Semaphore(0), threading.Semaphore(0)
    served = HttpEndpoints("127.0.0.1:0", routes(), LOG)
    served.start()
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=HANG_S) for _ in range(2)]
    newcomer = None
    try:
        assert Stepped.ready.acquire(timeout=HANG_S)
        Stepped.turns.release()  # one select(): both accepted, both waiting for their request
        assert Stepped.ready.acquire(timeout=HANG_S)
        newcomer = socket.create_connection(("127.0.0.1", served.port), timeout=HANG_S)
        idle[0].sendall(b"GET /readyz")  # the oldest becomes readable after the listener did
        # Next select() returns [listener, oldest]: accepting the newcomer drops the oldest.
        for _ in range(1000):
            Stepped.turns.release()
        assert status(served.port, "/healthz") == 200
        assert status(served.port, "/metrics") == 200
    finally:
        for conn in [*idle, newcomer]:
            if conn is not None:
                conn.close()
        for _ in range(1000):
            Stepped.turns.release()
        served.stop()
    assert served.failure is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_storm_of_scrapes_leaves_the_probes_answering(server: HttpEndpoints) -> None:
    probes: list[int] = []
    storm_over = threading.Event()

    def probe_meanwhile() -> None:
        while not storm_over.is_set():
            probes.extend([status(server.port, "/healthz"), status(server.port, "/readyz")])

    prober = threading.Thread(target=probe_meanwhile)
    prober.start()
    try:
        with ThreadPoolExecutor(100) as pool:  # 500 scrapes, 100 at a time
            scrapes = list(pool.map(lambda _: raw(server.port, b"GET /metrics HTTP/1.1\r\n\r\n"), range(500)))
    finally:
        storm_over.set()
        prober.join(HANG_S)
    assert len(scrapes) == 500
    # 100 at a time fit in the waiting line and the route's queue: every scrape is answered whole.
    assert all(s.startswith("HTTP/1.1 200 ") and s.endswith(METRICS.decode()) for s in scrapes)
    assert probes and set(probes) == {200}
    assert status(server.port, "/healthz") == 200


def test_slowloris_clients_are_closed_and_hold_up_no_probe(monkeypatch: pytest.MonkeyPatch,
                                                            server: HttpEndpoints) -> None:
    monkeypatch.setattr(endpoints, "REQUEST_DEADLINE_S", 1.0)
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S) for _ in range(10)]
    closed = 0
    try:
        for byte in b"GET /metrics HTTP/1.1\r\nHost: node\r\n":  # a byte each round, never the end
            for conn in slow:
                with contextlib.suppress(OSError):  # closed by the server already
                    conn.sendall(bytes([byte]))
            assert status(server.port, "/healthz") == 200
            threading.Event().wait(0.05)
        for conn in slow:  # the server gave up on each: end of stream, or a reset
            try:
                closed += conn.recv(1) == b""
            except ConnectionResetError:
                closed += 1
    finally:
        for conn in slow:
            conn.close()
    assert closed == 10
    assert status(server.port, "/readyz") == 200


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"garbage\r\n\r\n", {"400"}),
        (b"\r\n\r\n", {"400"}),
        (b"GET\r\n\r\n", {"400"}),
        (b"BREW /healthz HTTP/1.1\r\n\r\n", {"405"}),
        (b"GET /nothing HTTP/1.1\r\n\r\n", {"404"}),
        (b"GET /healthz\n\n", {"200"}),
        (b"\x00\xff\xfe binary\r\n\r\n", {"400"}),
        (b"A" * (endpoints.MAX_REQUEST_BYTES + 4096), {"400", ""}),  # answered, or reset for the unread rest
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"x" * 40000 + b"\r\n\r\n", {"200", ""}),
    ],
)
def test_malformed_requests_are_answered_and_the_server_goes_on(server: HttpEndpoints, request_bytes: bytes,
                                                               expected: set[str]) -> None:
    answer = raw(server.port, request_bytes)
    assert (answer.split(" ", 2)[1] if answer else "") in expected
    assert status(server.port, "/healthz") == 200


def test_a_client_that_closes_or_half_sends_leaves_the_server_serving(server: HttpEndpoints) -> None:
    for request in (b"", b"GET /hea", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):  # the last: TLS
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S)
        conn.sendall(request)
        conn.close()
    assert status(server.port, "/healthz") == 200


def test_an_answer_that_cannot_be_written_costs_that_answer_only(caplog: pytest.LogCaptureFixture) -> None:
    unencodable = Response(200, b"", "text/\u2603")
    served = HttpEndpoints("127.0.0.1:0", {**routes(), "/odd": lambda: unencodable}, LOG)
    served.start()
    tries = endpoints.ANSWERERS_PER_ROUTE + 2
    try:  # more failures than the route has answering threads: none of them is lost
        assert [raw(served.port, b"GET /odd HTTP/1.1\r\n\r\n") for _ in range(tries)] == [""] * tries
        assert status(served.port, "/healthz") == 200
    finally:
        served.stop()
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == tries and all(r.exc_info for r in failures)


class Breaking(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def select(self, timeout: float | None = None) -> Any:
        raise RuntimeError("the selector broke")


def test_a_dead_serving_thread_closes_the_port_logs_why_and_calls_on_death(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(selectors, "DefaultSelector", Breaking)
    dead = threading.Event()
    whats: list[str] = []

    def on_death(what: str) -> None:
        whats.append(what)
        dead.set()

    served = HttpEndpoints("127.0.0.1:0", routes(), LOG, on_death)
    served.start()
    try:
        assert dead.wait(HANG_S)
        with pytest.raises(ConnectionRefusedError):  # the probe fails at once, it does not time out
            socket.create_connection(("127.0.0.1", served.port), timeout=HANG_S)
    finally:
        served.stop()
    assert whats == ["The HTTP server on 127.0.0.1:0"]
    assert served.failure == "RuntimeError: the selector broke"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert errors[0].getMessage() == ("The HTTP server on 127.0.0.1:0 stopped (RuntimeError: the selector "
                                      "broke): its /healthz, /metrics, /readyz go unanswered")


def test_the_plugin_ends_when_its_http_server_dies(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.daemon.guard import on_fatal
    from nvdp.daemon.report.recording import Recorder
    from nvdp.plugin import observe

    monkeypatch.setattr(selectors, "DefaultSelector", Breaking)
    fatal = threading.Event()
    on_fatal(fatal.set)
    servers: list[HttpEndpoints] = []
    try:
        servers = observe.start(None, argparse.Namespace(health_address="127.0.0.1:0"),  # type: ignore[arg-type]
                                LOG, Recorder())
        assert fatal.wait(HANG_S)
    finally:
        on_fatal(None)
        for served in servers:
            served.stop()
    assert ("The HTTP server on 127.0.0.1:0 stopped unexpectedly; the plugin cannot go on without it"
            in caplog.messages)


def test_the_dra_plugin_ends_when_its_http_server_dies(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.daemon.guard import on_fatal
    from nvdp.dra.probes import serve_probes

    monkeypatch.setattr(selectors, "DefaultSelector", Breaking)
    process = argparse.Namespace(healthz=routes()["/healthz"], readyz=routes()["/readyz"])
    flags = argparse.Namespace(metrics_address=None, health_address="127.0.0.1:0")
    fatal = threading.Event()
    on_fatal(fatal.set)
    servers: list[HttpEndpoints] = []
    try:
        servers = serve_probes(process, flags, LOG)  # type: ignore[arg-type]
        assert fatal.wait(HANG_S)
    finally:
        on_fatal(None)
        for served in servers:
            served.stop()
    assert ("The HTTP server on 127.0.0.1:0 stopped unexpectedly; the plugin cannot go on without it"
            in caplog.messages)


def test_the_mps_daemon_ends_when_its_metrics_server_dies(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.daemon.runloop import Inbox, Wake
    from nvdp.daemon.skeleton import Skeleton
    from nvdp.mps.main import serve_metrics

    monkeypatch.setattr(selectors, "DefaultSelector", Breaking)
    skeleton = Skeleton("mps-control-daemon", LOG, {}, guard=False)
    inbox = skeleton.inbox = Inbox()
    served = serve_metrics(skeleton, "127.0.0.1:0")
    try:
        assert Wake.FATAL in inbox.wait(HANG_S)  # the daemon's loop ends the process (exit 1)
    finally:
        for server in served:
            server.stop()
        inbox.close()
    assert ("The HTTP server on 127.0.0.1:0 stopped unexpectedly; the MPS daemon ends so that its pod "
            "restarts" in caplog.messages)
