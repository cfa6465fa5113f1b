"""The probe answers as functions of state, and the HTTP server's handling of odd requests."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from nvdp.daemon.report.endpoints import AddressError, HttpEndpoints, Response, parse_address
from nvdp.daemon.report.probes import Check, ResourceStatus, liveness, readiness


def test_ready_when_every_resource_is_registered_or_waits_for_mps() -> None:
    answer = readiness(
        None,
        [
            ResourceStatus("nvidia.com/gpu", True),
            ResourceStatus("nvidia.com/mig-1g.10gb", False, "waiting for the MPS daemon: ..."),
        ],
    )
    assert answer.status == 200
    assert answer.body.decode().splitlines() == [
        "ready",
        "nvidia.com/gpu: registered",
        "nvidia.com/mig-1g.10gb: waiting for the MPS daemon: ...",
    ]


def test_not_ready_while_a_resource_is_unregistered_or_the_plugin_starts() -> None:
    answer = readiness(None, [ResourceStatus("nvidia.com/gpu", False)])
    assert answer.status == 503
    assert "nvidia.com/gpu: not registered with the kubelet yet" in answer.body.decode()
    assert readiness("starting", []).status == 503
    assert readiness(None, []).status == 200


def test_live_only_when_every_check_passes() -> None:
    assert liveness([Check("manager"), Check("health loop")]).status == 200
    dead = liveness([Check("manager"), Check("server nvidia.com/gpu", "does not answer: DEADLINE_EXCEEDED")])
    assert dead.status == 503
    assert dead.body.decode().splitlines()[0] == "not live"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9445", ("0.0.0.0", 9445)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9445", ("::1", 9445)),
    ],
)
def test_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["9445", "host:", ":http", ":70000"])
def test_bad_addresses_say_the_form(text: str) -> None:
    with pytest.raises(AddressError, match="HOST:PORT or :PORT"):
        parse_address(text)


@pytest.fixture
def server() -> Iterator[HttpEndpoints]:
    def broken() -> Response:
        raise RuntimeError("boom")

    endpoints = HttpEndpoints(
        "127.0.0.1:0", {"/ok": lambda: Response(200, b"fine\n"), "/broken": broken}, logging.getLogger("test")
    )
    endpoints.start()
    yield endpoints
    endpoints.stop()


def raw(port: int, request: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
    return data.decode()


def test_http_answers(server: HttpEndpoints) -> None:
    ok = raw(server.port, b"GET /ok?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith("HTTP/1.1 200 OK\r\n") and ok.endswith("\r\n\r\nfine\n")
    assert "Content-Length: 5\r\n" in ok
    head = raw(server.port, b"HEAD /ok HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 200 OK") and head.endswith("\r\n\r\n")
    assert raw(server.port, b"GET /nope HTTP/1.1\r\n\r\n").endswith("not found; try /broken /ok\n")
    assert raw(server.port, b"POST /ok HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 405 ")
    assert raw(server.port, b"garbage\r\n\r\n").startswith("HTTP/1.1 400 ")
    # A failing handler is a 500, and the server keeps serving.
    assert raw(server.port, b"GET /broken HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 500 ")
    assert raw(server.port, b"GET /ok HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 200 ")


def test_a_silent_client_is_dropped_after_the_read_timeout(server: HttpEndpoints) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):
        # Sends nothing; the server drops it after its read timeout and answers the next client.
        assert raw(server.port, b"GET /ok HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 200 ")
