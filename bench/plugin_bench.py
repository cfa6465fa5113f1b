"""Plugin benchmark: the real plugin process on the stand-in NVML, driven by the kubelet simulator.

    .venv/bin/python bench/plugin_bench.py [--quick]

Prints one table row per metric: target, measured value, pass/fail. Exit status 0 even when a
target is missed (the table is the result); 1 only when the benchmark itself could not run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from nvdp.kubelet_sim import KubeletSim  # noqa: E402
from sim.nvml import NodeSim, build_library  # noqa: E402

REPLICAS_128 = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 128
"""


@dataclass
class Row:
    metric: str
    target: str
    measured: str
    ok: bool


@dataclass
class Running:
    kubelet: KubeletSim
    node: NodeSim
    process: subprocess.Popen[bytes]
    started_at: float


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@contextmanager
def plugin(profile: str, config: str | None = None) -> Iterator[Running]:
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-") as tmp:
        work = Path(tmp)
        node = NodeSim(profile, work / "state")
        plugin_dir = work / "device-plugins"
        env = {k: v for k, v in os.environ.items() if k not in ("CONFIG_FILE", "DEVICE_PLUGIN_PATH")}
        env.update(node.env)
        env["DEVICE_PLUGIN_PATH"] = str(plugin_dir)
        env["PYTHONPATH"] = str(ROOT / "src")
        if config:
            (work / "config.yaml").write_text(config)
            env["CONFIG_FILE"] = str(work / "config.yaml")
        with KubeletSim(plugin_dir) as kubelet, open(work / "plugin.log", "wb") as log:
            started = time.monotonic()
            process = subprocess.Popen([sys.executable, "-m", "nvdp.plugin.main"], env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            try:
                yield Running(kubelet, node, process, started)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(15)


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step timed out")
        time.sleep(0.0005)


def bench_start(runs: int) -> Row:
    times = []
    for _ in range(runs):
        with plugin("t4") as run:
            wait_until(lambda: bool(run.kubelet.registrations))
            times.append(run.kubelet.registrations[0]["monotonic"] - run.started_at)
    value = statistics.median(times) * 1000
    return Row("start -> registered (median)", "300 ms", f"{value:.0f} ms", value <= 300)


def bench_runtime(calls: int) -> list[Row]:
    rows = []
    with plugin("t4") as run:
        kubelet, node = run.kubelet, run.node
        devices = kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=15)
        ids = [[devices[0]["id"]]]
        latencies = []
        for _ in range(calls):
            t0 = time.perf_counter()
            kubelet.allocate("nvidia.com/gpu", ids)
            latencies.append((time.perf_counter() - t0) * 1000)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        rows.append(Row(f"Allocate p50 ({calls} calls)", "1 ms", f"{p50:.2f} ms", p50 <= 1))
        rows.append(Row(f"Allocate p99 ({calls} calls)", "1 ms", f"{p99:.2f} ms", p99 <= 1))

        wait_until(lambda: len(kubelet.registrations) >= 1)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - run.started_at)))
        rss = rss_mib(run.process.pid)
        rows.append(Row("plugin RSS after 5 s", "45 MiB", f"{rss:.1f} MiB", rss <= 45))

        count = len(kubelet.registrations)
        kubelet.stop()
        t0 = time.monotonic()
        kubelet.start()
        wait_until(lambda: len(kubelet.registrations) > count)
        value = (kubelet.registrations[count]["monotonic"] - t0) * 1000
        rows.append(Row("kubelet.sock re-created -> re-registered", "20 ms", f"{value:.1f} ms", value <= 20))

        kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=1, timeout=15)
        t0 = time.monotonic()
        node.inject_xid(node.inventory.gpus[0].uuid, 48)
        kubelet.wait_for_resource("nvidia.com/gpu", count=1, healthy=0, timeout=15)
        value = (time.monotonic() - t0) * 1000
        rows.append(Row("XID -> Unhealthy seen by the kubelet", "100 ms", f"{value:.1f} ms", value <= 100))
    return rows


def bench_preferred(calls: int) -> list[Row]:
    rows = []
    for label, config, count in (("8 GPUs x 128 replicas", REPLICAS_128, 1024), ("8 A100 NVLink, whole GPUs",
                                                                                 None, 8)):
        with plugin("a100-sxm-8", config) as run:
            devices = run.kubelet.wait_for_resource("nvidia.com/gpu", count=count, timeout=30)
            available = [d["id"] for d in devices]
            size = 4
            latencies = []
            for _ in range(calls):
                t0 = time.perf_counter()
                run.kubelet.preferred("nvidia.com/gpu", available, [], size)
                latencies.append((time.perf_counter() - t0) * 1000)
            p50 = percentile(latencies, 50)
            rows.append(Row(f"GetPreferredAllocation p50, {label}, size {size}", "2 ms", f"{p50:.2f} ms",
                            p50 <= 2))
    return rows


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def print_table(rows: list[Row]) -> None:
    header = ("metric", "target", "measured", "result")
    table = [header, *((r.metric, r.target, r.measured, "pass" if r.ok else "FAIL") for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark the plugin process with the stand-ins.")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args(argv)
    build_library()
    try:
        rows = [bench_start(1 if args.quick else 5)]
        rows += bench_runtime(100 if args.quick else 1000)
        rows += bench_preferred(20 if args.quick else 200)
    except (TimeoutError, RuntimeError, OSError) as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
