"""Where the plugin process spends its start-up time, its memory and its per-Allocate work.

    .venv/bin/python bench/profile_plugin.py imports   # -X importtime of the serving process, by package
    .venv/bin/python bench/profile_plugin.py memory    # tracemalloc by file + RSS by mapping, after start
    .venv/bin/python bench/profile_plugin.py allocate  # cProfile of the Allocate handler, and gRPC's share
    .venv/bin/python bench/profile_plugin.py phases    # spawn -> registered, stage by stage (NVIDIA's mock)

Every mode runs the real plugin (`python -m nvdp.plugin.main`, t4 profile of the stand-in NVML)
registered with the kubelet simulator, as plugin_bench.py does; `phases` runs it as the start-up
figure does (console-script entry point, NVIDIA's mock NVML with 8x A100). Figures go to
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import io
import pstats
import re
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src"), str(ROOT / "bench")]

from plugin_bench import ENTRY_POINT, load_average, plugin, unpack_upstream, wait_until  # noqa: E402

# Runs the plugin with tracemalloc on; SIGUSR1 writes the top allocation sites beside the socket folder.
_TRACED_MAIN = """
import os, signal, sys, tracemalloc
tracemalloc.start(int(os.environ.get("NVDP_TRACE_FRAMES", "1")))
def dump(signum, frame):
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    with open(os.path.join(os.environ["DEVICE_PLUGIN_PATH"], os.pardir, "trace-out"), "w") as out:
        total = sum(s.size for s in snap.statistics("filename"))
        out.write(f"total traced {total / 2**20:.2f} MiB\\n")
        for stat in snap.statistics("filename")[:25]:
            out.write(f"{stat.size / 1024:9.0f} KiB {stat.count:7d} blocks  {stat.traceback[0].filename}\\n")
signal.signal(signal.SIGUSR1, dump)
from nvdp.plugin.main import main
sys.exit(main())
"""

# The console-script entry point with a stamp (CLOCK_MONOTONIC, shared with the harness) at the start
# and end of each stage of PluginProcess; the stamps go to stderr once health checking has started.
_PHASES_MAIN = """
import time
_stamps = [("interpreter ready", time.monotonic())]
import sys
import nvdp.plugin.main as _main
_stamps.append(("nvdp.plugin.main imported", time.monotonic()))
def _stamped(name, method):
    def run(self, *args, **kwargs):
        _stamps.append((name + " <", time.monotonic()))
        result = method(self, *args, **kwargs)
        _stamps.append((name + " >", time.monotonic()))
        if name == "start_health":
            sys.stderr.write("PHASES " + repr(_stamps) + "\\n")
        return result
    return run
for _name in ("load_config", "discover", "make_plan", "serve", "start_health"):
    setattr(_main.PluginProcess, _name, _stamped(_name, getattr(_main.PluginProcess, _name)))
""" + ENTRY_POINT

# (label, from stamp, to stamp); "spawn" and "registered" are the harness's own clock readings.
_PHASES = (
    ("spawn -> interpreter ready", "spawn", "interpreter ready"),
    ("import nvdp.plugin.main", "interpreter ready", "nvdp.plugin.main imported"),
    ("arguments, logging, signals", "nvdp.plugin.main imported", "load_config <"),
    ("load config", "load_config <", "load_config >"),
    ("NVML: pynvml, init, GPUs", "discover <", "discover >"),
    ("plan (imports grpc, API)", "make_plan <", "make_plan >"),
    ("servers up -> registered", "serve <", "registered"),
    ("spawn -> registered", "spawn", "registered"),
    ("registered -> health started", "registered", "start_health >"),
)


def profile_phases(starts: int) -> None:
    upstream = unpack_upstream()
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(starts):
        with plugin(None, upstream=upstream, python_args=["-c", _PHASES_MAIN]) as run:
            wait_until(lambda: "PHASES " in run.log_path.read_text(), timeout=30)
            line = next(x for x in run.log_path.read_text().splitlines() if x.startswith("PHASES "))
            stamps = dict(ast.literal_eval(line.removeprefix("PHASES ")))
            stamps["spawn"] = run.started_at
            stamps["registered"] = run.kubelet.registrations[0]["monotonic"]
        for label, start, end in _PHASES:
            samples[label].append((stamps[end] - stamps[start]) * 1000)
    print(f"start-up stage by stage, NVIDIA's mock NVML (8x A100), medians of {starts} starts; "
          f"load {load_average()}\n")
    for label, _start, _end in _PHASES:
        values = samples[label]
        print(f"  {label:32} {statistics.median(values):7.1f} ms   ({min(values):.1f}-{max(values):.1f})")


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def profile_imports() -> None:
    with plugin("t4", python_args=["-X", "importtime", "-m", "nvdp.plugin.main"]) as run:
        wait_until(lambda: bool(run.kubelet.registrations))
        time.sleep(0.5)  # imports made right after registration (health checks) count too
        text = run.log_path.read_text()
    by_package: dict[str, int] = defaultdict(int)
    rows = []
    for line in text.splitlines():
        match = _IMPORT_LINE.match(line)
        if not match:
            continue
        self_us, cumulative_us, name = int(match[1]), int(match[2]), match[4]
        by_package[_package(name)] += self_us
        rows.append((self_us, cumulative_us, len(match[3]) // 2, name))
    total = sum(by_package.values())
    print(f"{len(rows)} modules imported, {total / 1000:.1f} ms of import time (self, summed)\n")
    print("by package (self time):")
    for package, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {us / 1000:7.1f} ms  {package}")
    print("\nslowest top-level imports (cumulative):")
    top_level = sorted((r for r in rows if r[2] == 0), key=lambda r: -r[1])
    for _self_us, cumulative_us, _depth, name in top_level[:15]:
        print(f"  {cumulative_us / 1000:7.1f} ms  {name}")


def _package(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("google", "nvdp", "grpc") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def profile_memory() -> None:
    with plugin("t4", python_args=["-c", _TRACED_MAIN]) as run:
        wait_until(lambda: bool(run.kubelet.registrations))
        time.sleep(1.0)
        smaps = Path(f"/proc/{run.process.pid}/smaps").read_text()
        status = Path(f"/proc/{run.process.pid}/status").read_text()
        trace_file = run.work / "trace-out"
        run.process.send_signal(signal.SIGUSR1)
        wait_until(lambda: trace_file.exists() and trace_file.stat().st_size > 0, timeout=10)
        time.sleep(0.2)
        print(trace_file.read_text())
    for line in status.splitlines():
        if line.startswith(("VmRSS", "VmHWM", "Threads", "RssAnon", "RssFile")):
            print(line)
    print("\nRSS by mapping (tracemalloc itself inflates the heap here):")
    for name, kib in _rss_by_mapping(smaps)[:12]:
        print(f"  {kib / 1024:6.1f} MiB  {name}")


def _rss_by_mapping(smaps: str) -> list[tuple[str, int]]:
    sizes: dict[str, int] = defaultdict(int)
    current = "?"
    for line in smaps.splitlines():
        head = line.split()
        if head and re.match(r"^[0-9a-f]+-[0-9a-f]+$", head[0]):
            current = head[5] if len(head) > 5 else "[anonymous]"
            current = Path(current).name if current.startswith("/") else current
        elif line.startswith("Rss:"):
            sizes[current] += int(head[1])
    return sorted(sizes.items(), key=lambda kv: -kv[1])


def profile_allocate(calls: int) -> None:
    """The handler's own work in-process (cProfile), then the same calls through the real server."""
    import logging
    import tempfile

    from nvdp.config.loader import load_config
    from nvdp.inventory.profile import load_profile
    from nvdp.plan import plan
    from nvdp.plugin.api import deviceplugin_pb2 as pb
    from nvdp.plugin.main import LOG_FORMAT
    from nvdp.plugin.server import ResourceServer
    from sim.nvml import resolve_profile

    # As the plugin logs: INFO, one line per Allocate, written to a file (the plugin writes stderr).
    log_file = tempfile.NamedTemporaryFile("w", prefix="nvdp-profile-", suffix=".log")  # noqa: SIM115
    handler_ = logging.StreamHandler(log_file)
    handler_.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().handlers[:] = [handler_]
    logging.getLogger().setLevel(logging.INFO)
    inventory = load_profile(resolve_profile("t4"))
    config = load_config(None, {}, {})
    resource = plan(config, inventory).resources[0]
    server = ResourceServer(resource, config, inventory, logger=logging.getLogger("nvidia-device-plugin"))
    one = pb.ContainerAllocateRequest(devices_ids=[resource.devices[0].id])
    request = pb.AllocateRequest(container_requests=[one])
    handler = server.service.Allocate  # the servicer method, without gRPC
    for _ in range(100):
        handler(request, None)
    t0 = time.perf_counter()
    for _ in range(calls):
        handler(request, None)
    per_call_us = (time.perf_counter() - t0) / calls * 1e6
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        handler(request, None)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    print(f"Allocate handler alone: {per_call_us:.1f} us per call ({calls} calls, no profiler)\n")
    print("\n".join(text.getvalue().splitlines()[4:]))
    logging.getLogger().setLevel(logging.WARNING)
    t0 = time.perf_counter()
    for _ in range(calls):
        handler(request, None)
    quiet_us = (time.perf_counter() - t0) / calls * 1e6
    print(f"Allocate handler with logging at WARNING: {quiet_us:.1f} us per call")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("imports", "memory", "allocate", "phases"))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--starts", type=int, default=10, help="phases: how many starts to take medians of")
    args = parser.parse_args(argv)
    if args.mode == "phases":
        profile_phases(args.starts)
    elif args.mode == "imports":
        profile_imports()
    elif args.mode == "memory":
        profile_memory()
    else:
        profile_allocate(args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
