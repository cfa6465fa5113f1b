"""grpc imported the plugin's way: its asyncio half loads on first use, and then works as usual."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]

_SERVE_WITHOUT_ASYNCIO = """
import sys
from concurrent import futures
from nvdp.daemon.grpc_import import grpc
loaded = [m for m in ("asyncio.events", "asyncio.base_events", "grpc.aio._server", "ssl", "_ssl")
          if m in sys.modules]
assert loaded == [], loaded
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_insecure_port("unix:" + sys.argv[1])
server.start()
channel = grpc.insecure_channel("unix:" + sys.argv[1])
grpc.channel_ready_future(channel).result(timeout=10)
channel.close()
server.stop(0)
assert "asyncio.events" not in sys.modules and "grpc.aio._server" not in sys.modules, "serving loaded asyncio"
print("ok")
"""

# Everything that reaches for the asyncio half afterwards gets the real modules, ssl included.
_ASYNCIO_LATER = """
import sys
from nvdp.daemon.grpc_import import grpc
import asyncio
from asyncio import sleep
import asyncio.sslproto
assert asyncio.sslproto.ssl is not None, "asyncio without TLS"
assert sys.modules["asyncio"].get_running_loop is asyncio.get_running_loop
from grpc._cython import cygrpc
assert cygrpc.asyncio.AbstractEventLoop is asyncio.AbstractEventLoop  # grpc's own reference, loaded

async def round_trip() -> str:
    server = grpc.aio.server()
    server.add_insecure_port("unix:" + sys.argv[1])
    await server.start()
    async with grpc.aio.insecure_channel("unix:" + sys.argv[1]) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
    await server.stop(0)
    await sleep(0)
    return "ok"

print(asyncio.run(round_trip()))
import grpc.aio
assert sys.modules["grpc.aio"] is grpc.aio and grpc.aio.server is not None
import ssl
assert ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED
"""

# A process that already uses asyncio keeps its module object; grpc.aio still loads on first use.
_ASYNCIO_FIRST = """
import sys, asyncio
before = sys.modules["asyncio"]
from nvdp.daemon.grpc_import import grpc
assert sys.modules["asyncio"] is before
assert grpc.aio.insecure_channel is not None and "grpc.aio._channel" in sys.modules
print("ok")
"""


def _run(code: str, tmp_path: Path) -> str:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.sock")], capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_serving_loads_neither_asyncio_nor_ssl(tmp_path: Path) -> None:
    assert _run(_SERVE_WITHOUT_ASYNCIO, tmp_path) == "ok"


def test_asyncio_and_grpc_aio_work_when_used_later(tmp_path: Path) -> None:
    assert _run(_ASYNCIO_LATER, tmp_path) == "ok"


def test_a_process_with_asyncio_already_keeps_it(tmp_path: Path) -> None:
    assert _run(_ASYNCIO_FIRST, tmp_path) == "ok"
