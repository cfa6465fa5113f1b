"""The HTTP server under many clients: idle ones never keep an answer from the others."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from nvdp.daemon.report import endpoints
from nvdp.daemon.report.endpoints import HttpEndpoints, Response

RELEASE = threading.Event()
HELD = threading.Semaphore(0)  # one release per handler that has started waiting


def held() -> Response:
    HELD.release()
    RELEASE.wait(10)
    return Response(200, b"held\n")


@pytest.fixture
def server() -> Iterator[HttpEndpoints]:
    RELEASE.clear()
    routes = {"/ok": lambda: Response(200, b"fine\n"), "/held": held}
    served = HttpEndpoints("127.0.0.1:0", routes, logging.getLogger("test"))
    served.start()
    yield served
    RELEASE.set()
    served.stop()


def ask(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
    return data.decode()


def test_more_idle_connections_than_may_wait_leave_room_for_a_probe(server: HttpEndpoints) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
            for _ in range(endpoints.MAX_WAITING + 16)]
    try:
        assert ask(server.port, "/ok").startswith("HTTP/1.1 200 ")
    finally:
        for conn in idle:
            conn.close()


def test_a_busy_route_queues_then_answers_503_and_holds_up_no_other_route(
        server: HttpEndpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints, "QUEUED_PER_ROUTE", 1)
    results: list[str] = []

    def asker() -> threading.Thread:
        thread = threading.Thread(target=lambda: results.append(ask(server.port, "/held")))
        thread.start()
        return thread

    askers = [asker() for _ in range(endpoints.ANSWERERS_PER_ROUTE)]
    for _ in askers:  # every answerer of /held taken
        assert HELD.acquire(timeout=10)
    assert ask(server.port, "/ok").startswith("HTTP/1.1 200 ")  # another route has its own answerers
    askers.append(asker())
    queue = server._answerers["/held"]._queue  # white box: wait until that one is queued
    while not queue:
        threading.Event().wait(0.01)
    busy = ask(server.port, "/held")
    assert busy.startswith("HTTP/1.1 503 ") and busy.endswith("busy; try again\n")
    RELEASE.set()
    for thread in askers:
        thread.join(10)
    assert len(results) == endpoints.ANSWERERS_PER_ROUTE + 1 and all(r.endswith("held\n") for r in results)
    assert ask(server.port, "/held").startswith("HTTP/1.1 200 ")
