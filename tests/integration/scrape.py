"""HTTP helpers for tests that probe and scrape a running process."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for_http(port: int, path: str, status: int, timeout: float = 10.0, containing: str = "") -> str:
    """The body of the first answer with `status` (and `containing` in it): the state it shows may need a
    moment after the log line a test waited for (e.g. "starting" until the first attempts are done)."""
    deadline = time.monotonic() + timeout
    seen: object = None
    while time.monotonic() < deadline:
        try:
            code, body = get(port, path)
        except OSError as err:
            seen = err
        else:
            if code == status and containing in body:
                return body
            seen = (code, body)
        time.sleep(0.05)
    wanted = f"{status} with {containing!r}" if containing else f"{status}"
    raise AssertionError(f"{path} did not answer {wanted} within {timeout}s; last: {seen}")


def scrape(port: int) -> Samples:
    code, text = get(port, "/metrics")
    assert code == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))
