"""What metrics and probes cost the plugin: Allocate latency with and without metrics, probe and
scrape CPU, idle CPU, RSS. The real plugin process on the stand-in NVML, driven by the kubelet simulator.

    .venv/bin/python bench/observability_bench.py [--quick]

Prints one table; CPU is the plugin process's own user+system time from /proc/<pid>/stat.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src"), str(ROOT / "bench")]

from plugin_bench import Row, percentile, print_table, rss_mib  # noqa: E402

from sim.kubelet import KubeletSim  # noqa: E402
from sim.nvml import NodeSim, build_library  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
# The chart's default probe periods: readiness every 10 s, liveness every 30 s.
PROBES_PER_HOUR = 3600 // 10 + 3600 // 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


@contextmanager
def plugin(*args: str) -> Iterator[tuple[KubeletSim, subprocess.Popen[bytes], NodeSim]]:
    with tempfile.TemporaryDirectory(prefix="nvdp-obs-bench-") as tmp:
        work = Path(tmp)
        node = NodeSim("t4", work / "state")
        plugin_dir = work / "device-plugins"
        dropped = ("CONFIG_FILE", "DEVICE_PLUGIN_PATH", "NODE_NAME")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        env.update(node.env, DEVICE_PLUGIN_PATH=str(plugin_dir), PYTHONPATH=str(ROOT / "src"))
        with KubeletSim(plugin_dir) as kubelet, open(work / "plugin.log", "wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "nvdp.plugin.main", *args], env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            try:
                kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=15)
                yield kubelet, process, node
            finally:
                process.terminate()
                process.wait(15)


def allocate_latencies(kubelets: list[KubeletSim], calls: int) -> list[list[float]]:
    """Latencies per kubelet, calls interleaved in batches so machine load falls on each alike."""
    ids = [[k.devices("nvidia.com/gpu")[0]["id"]] for k in kubelets]
    for kubelet, request in zip(kubelets, ids, strict=True):
        for _ in range(50):  # warm-up: connections, first-call imports
            kubelet.allocate("nvidia.com/gpu", [request])
    latencies: list[list[float]] = [[] for _ in kubelets]
    batch = 50
    for _ in range(calls // batch):
        for kubelet, request, out in zip(kubelets, ids, latencies, strict=True):
            for _ in range(batch):
                t0 = time.perf_counter()
                kubelet.allocate("nvidia.com/gpu", [request])
                out.append((time.perf_counter() - t0) * 1000)
    return latencies


def get(port: int, path: str) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        response.read()


def cpu_per_call(pid: int, port: int, path: str, calls: int) -> float:
    """The plugin's CPU milliseconds per GET of `path`."""
    get(port, path)
    before = cpu_seconds(pid)
    for _ in range(calls):
        get(port, path)
    return (cpu_seconds(pid) - before) * 1000 / calls


def idle_cpu_percent(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds * 100


def exec_probe_cpu_ms(runs: int) -> float:
    """CPU of one `nvdp --version` process: the least an exec probe running this package would cost."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        subprocess.run([sys.executable, "-m", "nvdp.cli", "--version"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used * 1000 / runs


def recording_cost_us(calls: int) -> tuple[float, float]:
    """Microseconds the recording points of one Allocate take in-process: metrics off, then on."""
    from nvdp import recording

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            started = time.perf_counter()
            recording.allocated("nvidia.com/gpu", 1)
            recording.allocate_duration("nvidia.com/gpu", time.perf_counter() - started)
        return (time.perf_counter() - t0) * 1e6 / calls

    off = run()
    recording.enable()
    return off, run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args(argv)
    calls, probe_calls, idle_s = (200, 50, 5.0) if args.quick else (2000, 500, 30.0)
    build_library()
    rows: list[Row] = []
    try:
        port = free_port()
        with plugin() as (kubelet, process, _node), plugin(
                f"--metrics-address=127.0.0.1:{port}", f"--health-address=127.0.0.1:{port}") as (
                kubelet_m, process_m, _node_m):
            plain, measured = allocate_latencies([kubelet, kubelet_m], calls)
            get(port, "/metrics")
            idle_plain = idle_cpu_percent(process.pid, idle_s)
            idle_metrics = idle_cpu_percent(process_m.pid, idle_s)
            rss_plain = rss_mib(process.pid)
            readyz = cpu_per_call(process_m.pid, port, "/readyz", probe_calls)
            healthz = cpu_per_call(process_m.pid, port, "/healthz", probe_calls)
            scrape = cpu_per_call(process_m.pid, port, "/metrics", probe_calls)
            rss_metrics = rss_mib(process_m.pid)
        exec_ms = exec_probe_cpu_ms(3 if args.quick else 10)
    except (TimeoutError, RuntimeError, OSError) as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    for label, values in (("without metrics", plain), ("with metrics", measured)):
        p50, p99 = percentile(values, 50), percentile(values, 99)
        rows.append(Row(f"Allocate p50 {label} ({calls} calls)", "1 ms", f"{p50:.3f} ms", p50 <= 1))
        rows.append(Row(f"Allocate p99 {label} ({calls} calls)", "1 ms", f"{p99:.3f} ms", p99 <= 1))
    off_us, on_us = recording_cost_us(calls * 50)
    rows.append(Row("recording points per Allocate, metrics off", "1 us", f"{off_us:.2f} us", off_us <= 1))
    rows.append(Row("recording points per Allocate, metrics on", "10 us", f"{on_us:.2f} us", on_us <= 10))
    extra = percentile(measured, 50) - percentile(plain, 50)
    rows.append(Row("Allocate p50 added by metrics (interleaved runs)", "0.05 ms", f"{extra:+.3f} ms",
                    extra <= 0.05))
    per_hour = (readyz * (3600 // 10) + healthz * (3600 // 30)) / 1000
    rows.append(Row("CPU per /readyz", "1 ms", f"{readyz:.2f} ms", readyz <= 1))
    rows.append(Row("CPU per /healthz (calls each gRPC server)", "5 ms", f"{healthz:.2f} ms", healthz <= 5))
    rows.append(Row(f"probe CPU at chart periods ({PROBES_PER_HOUR}/h)", "0.01 % of a core",
                    f"{per_hour / 36:.4f} %", per_hour / 36 <= 0.01))
    rows.append(Row("CPU per exec probe (python process, for comparison)", "-", f"{exec_ms:.0f} ms", True))
    rows.append(Row("CPU per /metrics scrape", "5 ms", f"{scrape:.2f} ms", scrape <= 5))
    rows.append(Row(f"idle CPU without metrics ({idle_s:.0f} s)", "0.5 %", f"{idle_plain:.2f} %",
                    idle_plain <= 0.5))
    rows.append(Row(f"idle CPU with metrics+probes server ({idle_s:.0f} s)", "0.5 %", f"{idle_metrics:.2f} %",
                    idle_metrics <= 0.5))
    rows.append(Row("RSS without metrics", "45 MiB", f"{rss_plain:.1f} MiB", rss_plain <= 45))
    rows.append(Row("RSS with metrics", "50 MiB", f"{rss_metrics:.1f} MiB", rss_metrics <= 50))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
