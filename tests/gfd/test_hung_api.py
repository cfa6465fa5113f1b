"""Every API call of the GFD outputs gives up within a few seconds when the API server hangs.

The server here accepts connections and never answers (a hung or overloaded API server, a proxy that
holds the connection): no single call may block the labeller's loop longer than REQUEST_TIMEOUT_S.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdp.gfd.publish import NodeFeatureOutput, NodeOutput
from nvdp.kube import NodeWatcher, connect
from nvdp.kube.node import list_node

BOUND_S = 5.0  # what the labeller's loop may wait on one call
SLACK_S = 2.5  # thread start-up and a loaded machine


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts every connection and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join(2)
    for conn in held:
        conn.close()
    listener.close()


def kubeconfig(tmp_path: Path, port: int, scheme: str) -> Path:
    path = tmp_path / f"{scheme}.kubeconfig"
    cluster: dict[str, object] = {"server": f"{scheme}://127.0.0.1:{port}"}
    if scheme == "https":
        cluster["insecure-skip-tls-verify"] = True
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return path


def timed(call: Callable[[], object]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as e:
        return time.monotonic() - started, e
    return time.monotonic() - started, None


@pytest.mark.parametrize("scheme", ["http", "https"])  # https: the TLS handshake never completes
def test_no_call_blocks_longer_than_the_bound(silent_server: int, tmp_path: Path, scheme: str) -> None:
    config = kubeconfig(tmp_path, silent_server, scheme)
    node_output = NodeOutput(connect(config), "n1")
    node_output.set_current({})
    feature_output = NodeFeatureOutput(connect(config), "n1", "default")
    lister = connect(config)
    calls: dict[str, Callable[[], object]] = {
        "Node labels: patch": lambda: node_output.publish({"nvidia.com/gpu.count": "1"}, 1000),
        "NodeFeature: get": lambda: feature_output.publish({"nvidia.com/gpu.count": "1"}, 1000),
        "Node: list": lambda: list_node(lister, "n1"),
    }
    results: dict[str, tuple[float, BaseException | None]] = {}
    threads = [threading.Thread(target=lambda n=n, c=c: results.__setitem__(n, timed(c)), daemon=True)
               for n, c in calls.items()]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S + SLACK_S + 5)
    assert set(results) == set(calls), f"still blocked: {set(calls) - set(results)}"
    for name, (elapsed, error) in results.items():
        assert error is not None, f"{name}: answered by a server that never answers?"
        assert elapsed < BOUND_S + SLACK_S, f"{name} blocked {elapsed:.1f} s ({error!r})"


def test_a_watcher_on_a_silent_server_retries_and_stops_at_once(silent_server: int, tmp_path: Path) -> None:
    watcher = NodeWatcher(connect(kubeconfig(tmp_path, silent_server, "http")), "n1", lambda node: None)
    watcher.start()
    deadline = time.monotonic() + BOUND_S + SLACK_S
    while watcher.failures == 0:  # the list timed out and the watcher waits to retry
        assert time.monotonic() < deadline, "the watcher's list is still waiting"
        time.sleep(0.1)
    elapsed, _ = timed(watcher.stop)
    assert elapsed < 1.0
