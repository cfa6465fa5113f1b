"""The floor on gRPC's two Python servers: the thread pool (as nvdp) against grpc.aio, same harness.

    .venv/bin/python bench/floor_servers.py [--rounds 6] [--calls 2000]

bench/floor_plugin.py twice, FLOOR_SERVER=threads and FLOOR_SERVER=aio, alternating which goes first:
spawn -> registered and VmHWM after 5 s on NVIDIA's mock NVML (8x A100; the stand-in where
../shared/upstream is missing), Allocate p50 / p99 over `--calls` sequential calls from the kubelet
simulator, and XID -> Unhealthy on the stand-in (median of seven GPUs), exactly as plugin_bench.py
measures them. Prints the median of each over the rounds, aio/threads and the load average.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from plugin_bench import (  # noqa: E402
    FLOOR,
    RESOURCE,
    UPSTREAM_DIR,
    allocate_latencies,
    interleaved,
    percentile,
    plugin,
    proc_status_mib,
    unpack_upstream,
    wait_until,
    xid_ms,
)

SERVERS = ("threads", "aio")
FIGURES = (("start", "spawn -> registered", "ms"), ("hwm", "VmHWM after 5 s", "MiB"),
           ("p50", "Allocate p50", "ms"), ("p99", "Allocate p99", "ms"), ("xid", "XID -> Unhealthy", "ms"))


def measure(server: str, upstream: Path | None, calls: int) -> dict[str, float]:
    env = {"FLOOR_SERVER": server}
    figures: dict[str, float] = {}
    profile = None if upstream is not None else "a100-sxm-8"
    with plugin(profile, kind=FLOOR, upstream=upstream, extra_env=env) as run:
        wait_until(lambda: bool(run.kubelet.registrations))
        figures["start"] = (run.kubelet.registrations[0]["monotonic"] - run.started_at) * 1000
        devices = run.kubelet.wait_for_resource(RESOURCE, count=8, timeout=30)
        latencies = allocate_latencies(run.kubelet, devices[0]["id"], calls)
        figures["p50"], figures["p99"] = percentile(latencies, 50), percentile(latencies, 99)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - run.started_at)))
        figures["hwm"] = proc_status_mib(run.process.pid, "VmHWM")
    with plugin("a100-sxm-8", kind=FLOOR, extra_env=env) as run:
        figures["xid"] = xid_ms(run)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    # The mock is a library: unlike NVIDIA's plugin it needs no root, only ../shared/upstream.
    upstream = unpack_upstream() if (UPSTREAM_DIR / "setup.sh").is_file() else None
    results, loads = interleaved(SERVERS, args.rounds, lambda server: measure(server, upstream, args.calls))
    library = "NVIDIA's mock NVML" if upstream is not None else "the stand-in NVML"
    print(f"{args.rounds} rounds, medians; start, memory and Allocate on {library}, XID on the stand-in")
    print(f"load average: {' | '.join(loads)}")
    print(f"{'figure':22} {'threads':>10} {'aio':>10} {'aio/threads':>12}")
    for key, title, unit in FIGURES:
        threads, aio = (statistics.median(r[key] for r in results[s]) for s in SERVERS)
        print(f"{title:22} {threads:7.2f} {unit:3}{aio:7.2f} {unit:3}{aio / threads:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
