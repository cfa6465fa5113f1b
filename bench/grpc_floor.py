"""The floor under Allocate: a bare DevicePlugin server that answers one prebuilt response.

    .venv/bin/python bench/grpc_floor.py [--calls 1000] [--rounds 3]

Runs the same do-nothing server three ways, each in its own process, and calls Allocate from this
process the way the kubelet simulator does (a synchronous stub, one call at a time):
- `threads`: grpc.server with a ThreadPoolExecutor (what nvdp's ResourceServer uses);
- `threads+stream`: the same with one ListAndWatch stream held open, as the kubelet always does;
- `aio`: grpc.aio.server on an asyncio loop, also with the stream open;
- with `--option NAME=VALUE` (repeatable, e.g. grpc.minimal_stack=1): `threads+options`, the
  `threads+stream` server given those channel arguments.
Prints p50/p99 per variant (medians over interleaved rounds) and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import grpc  # noqa: E402

from nvdp.plugin.api import deviceplugin_pb2 as pb  # noqa: E402
from nvdp.plugin.api import deviceplugin_pb2_grpc as pb_grpc_typed  # noqa: E402

pb_grpc: Any = pb_grpc_typed

_SERVER = r"""
import asyncio, json, os, sys, threading, time
from concurrent import futures
import grpc
from nvdp.plugin.api import deviceplugin_pb2 as pb, deviceplugin_pb2_grpc as pb_grpc
variant, path = sys.argv[1], sys.argv[2]
RESPONSE = pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(
    envs={"NVIDIA_VISIBLE_DEVICES": "GPU-0"})])
LIST = pb.ListAndWatchResponse(devices=[pb.Device(ID="GPU-0", health="Healthy")])

class Sync:
    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()
    def ListAndWatch(self, request, context):
        yield LIST
        event = threading.Event()
        context.add_callback(event.set)
        event.wait()
    def Allocate(self, request, context):
        return RESPONSE
    GetPreferredAllocation = PreStartContainer = Allocate

class Async:
    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()
    async def ListAndWatch(self, request, context):
        yield LIST
        await asyncio.Event().wait()
    async def Allocate(self, request, context):
        return RESPONSE
    GetPreferredAllocation = PreStartContainer = Allocate

if variant == "aio":
    async def main():
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(Async(), server)
        server.add_insecure_port("unix://" + path)
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()
    asyncio.run(main())
else:
    options = [tuple(option) for option in json.loads(os.environ.get("FLOOR_GRPC_OPTIONS") or "[]")]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options)
    pb_grpc.add_DevicePluginServicer_to_server(Sync(), server)
    server.add_insecure_port("unix://" + path)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()
"""


ChannelOption = tuple[str, str | int]


def run_variant(variant: str, calls: int, options: list[ChannelOption] | None = None) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="nvdp-floor-") as tmp:
        path = os.path.join(tmp, "plugin.sock")
        server_kind = "aio" if variant == "aio" else "threads"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        if variant == "threads+options":
            env["FLOOR_GRPC_OPTIONS"] = json.dumps(options or [])
        process = subprocess.Popen([sys.executable, "-c", _SERVER, server_kind, path], env=env,
                                   stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None
            process.stdout.readline()
            with grpc.insecure_channel(f"unix://{path}") as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                stream = None
                if variant != "threads":
                    stream = stub.ListAndWatch(pb.Empty())
                    next(stream)
                request = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-0"])])
                for _ in range(100):
                    stub.Allocate(request, timeout=5)
                latencies = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    stub.Allocate(request, timeout=5)
                    latencies.append((time.perf_counter() - t0) * 1000)
                if stream is not None:
                    stream.cancel()
            latencies.sort()
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            return latencies[len(latencies) // 2], p99
        finally:
            process.kill()
            process.wait()


def channel_option(text: str) -> ChannelOption:
    name, equals, value = text.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE, e.g. grpc.minimal_stack=1")
    return name, int(value) if value.lstrip("-").isdigit() else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--option", type=channel_option, action="append", default=[], metavar="NAME=VALUE",
                        help="a gRPC channel argument for an extra threads+options variant; repeatable")
    args = parser.parse_args(argv)
    variants: tuple[str, ...] = ("threads", "threads+stream", "aio")
    if args.option:
        variants += ("threads+options",)
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    loads = [" ".join(Path("/proc/loadavg").read_text().split()[:3])]
    for round_no in range(args.rounds):
        order = variants if round_no % 2 == 0 else tuple(reversed(variants))
        for variant in order:
            results[variant].append(run_variant(variant, args.calls, args.option))
        loads.append(" ".join(Path("/proc/loadavg").read_text().split()[:3]))
    print(f"load average: {' | '.join(loads)}")
    if args.option:
        print("threads+options: " + ", ".join(f"{name}={value}" for name, value in args.option))
    print(f"{'server':16} {'p50':>8} {'p99':>8}   ({args.rounds} rounds x {args.calls} sequential Allocate)")
    for variant in variants:
        p50 = statistics.median(r[0] for r in results[variant])
        p99 = statistics.median(r[1] for r in results[variant])
        print(f"{variant:16} {p50:6.3f} ms {p99:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
