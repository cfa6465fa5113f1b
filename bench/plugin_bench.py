"""Plugin benchmark: the real plugin process, driven by the kubelet simulator.

    .venv/bin/python bench/plugin_bench.py [--quick]           # nvdp alone, on the stand-in NVML
    .venv/bin/python bench/plugin_bench.py --metrics           # what metrics and probes cost nvdp
    .venv/bin/python bench/plugin_bench.py --against-nvidia    # nvdp next to NVIDIA's plugin v0.20.0
    .venv/bin/python bench/plugin_bench.py --cdi               # CDI spec generation (root: mknod)

The first form prints one row per metric with its target and pass/FAIL. `--metrics` runs nvdp plain and
with `--metrics-address`/`--health-address` side by side and prints what metrics add to Allocate and
memory, and the plugin's CPU per probe and per scrape. `--cdi` times CDI spec generation on a fake
driver root (real device nodes, a 550 driver's ELF libraries among 1500 other files) for the stand-in
profiles a100-sxm-8 and h100-mig-single (56 MIG devices): warm in this process, cold in a fresh
interpreter (importing nvdp.cdi, then the first generation), next to the plugin's spawn -> registered
on the same profile in the same run. `--against-nvidia` unpacks
NVIDIA's plugin and NVIDIA's mock NVML (8x A100) from ../shared/upstream, runs both plugins and the
floor (bench/floor_plugin.py: the least a Python plugin must do) on that library with the same
simulator, rotating which goes first in each round, and prints the median of every figure for each,
nvdp/NVIDIA, nvdp/floor and nvdp's target. NVIDIA's mock cannot deliver events, so XID latency runs
every plugin on nvdp's stand-in; the floor does not re-register. NVIDIA's plugin
hard-codes the kubelet's socket folder and needs a private mount namespace (root); without root the
mode says so and skips.

Exit status 0 even when a target is missed (the table is the result); 1 only when the benchmark
itself could not run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from sim.kubelet import KubeletSim  # noqa: E402
from sim.nvml import NodeSim, build_library  # noqa: E402

if TYPE_CHECKING:
    from nvdp.inventory.model import Inventory

UPSTREAM_DIR = Path(os.environ.get("NVDP_UPSTREAM_SHARED", ROOT.parent / "shared" / "upstream"))
# Bytecode for nvdp is cached here: the image ships compiled modules (pip compiles at install), so the
# benchmark must not pay for compiling nvdp's sources at every start (PYTHONDONTWRITEBYTECODE is
# commonly set in development shells and CI).
PYCACHE = ROOT / ".build" / "bench-pycache"
RESOURCE = "nvidia.com/gpu"
STARTS_PER_ROUND = 3  # one start is one noisy sample; each round takes the median of these
NVIDIA, NVDP, FLOOR = "NVIDIA v0.20.0", "nvdp", "floor"
# The least a Python device plugin must do (bench/floor_plugin.py): nvdp's cost above it is its own.
FLOOR_ENTRY_POINT = "import sys\nfrom floor_plugin import main\nsys.exit(main())"

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
    process: subprocess.Popen[bytes]
    started_at: float
    work: Path
    log_path: Path
    node: NodeSim | None = None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# What the image's entry point (the `nvidia-device-plugin` console script) runs; `-m` would add runpy.
ENTRY_POINT = "import sys\nfrom nvdp.plugin.main import main\nsys.exit(main())"


def nvdp_command(args: Sequence[str] = ()) -> list[str]:
    """The plugin as its console script starts it, with `args` as its command line."""
    return [sys.executable, "-c", ENTRY_POINT, *args]


def nvdp_env(plugin_dir: Path, config_file: Path | None, src: Path = ROOT / "src") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CONFIG_FILE", "DEVICE_PLUGIN_PATH", "PYTHONDONTWRITEBYTECODE")}
    env["DEVICE_PLUGIN_PATH"] = str(plugin_dir)
    env["PYTHONPATH"] = str(src)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    if config_file is not None:
        env["CONFIG_FILE"] = str(config_file)
    return env


@contextmanager
def plugin(
    profile: str | None = "t4",
    config: str | None = None,
    *,
    kind: str = NVDP,
    upstream: Path | None = None,
    args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    src: Path | None = None,
) -> Iterator[Running]:
    """One plugin process registered to a fresh simulator.

    `profile` names a stand-in NVML profile; None runs on NVIDIA's mock NVML (`upstream` unpacked).
    `src` runs nvdp from another source tree (a baseline); `kind` is then that baseline's label.
    `kind=FLOOR` runs bench/floor_plugin.py with nvdp's environment; it reads no config.
    `args` is nvdp's command line. The process's stdout and stderr go to `Running.log_path`.
    """
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-") as tmp:
        work = Path(tmp)
        plugin_dir = work / "device-plugins"
        plugin_dir.mkdir()
        config_file = None
        if config:
            config_file = work / "config.yaml"
            config_file.write_text(config)
        node = NodeSim(profile, work / "state") if profile is not None else None
        nvml_env = node.env if node is not None else {"LD_LIBRARY_PATH": str(upstream / "lib")}  # type: ignore[operator]
        if kind == FLOOR:
            env = nvdp_env(plugin_dir, None)
            env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "bench"), env["PYTHONPATH"]))
            argv = [sys.executable, "-c", FLOOR_ENTRY_POINT]  # from cached bytecode, as nvdp
        elif kind != NVIDIA:
            env = nvdp_env(plugin_dir, config_file, src or ROOT / "src")
            argv = nvdp_command(args)
        else:
            assert upstream is not None
            env = dict(os.environ)
            env["NS_OVL_DIR"] = str(work / "ns-overlay")
            argv = ["bash", str(UPSTREAM_DIR / "run_in_ns.sh"), str(plugin_dir),
                    str(upstream / "bin" / "nvidia-device-plugin"), "--fail-on-init-error=true"]
            if config_file is not None:
                argv.append(f"--config-file={config_file}")
        env.update(nvml_env)
        env.update(extra_env or {})
        log_path = work / "plugin.log"
        with KubeletSim(plugin_dir) as kubelet, open(log_path, "wb") as log:
            started = time.monotonic()
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                yield Running(kubelet, process, started, work, log_path, node)
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step timed out")
        time.sleep(0.0005)


def proc_status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")


def allocate_latencies(kubelet: KubeletSim, device_id: str, calls: int) -> list[float]:
    latencies = []
    for _ in range(calls):
        t0 = time.perf_counter()
        kubelet.allocate(RESOURCE, [[device_id]])
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


def preferred_p50(kubelet: KubeletSim, available: list[str], size: int, calls: int) -> float:
    latencies = []
    for _ in range(calls):
        t0 = time.perf_counter()
        kubelet.preferred(RESOURCE, available, [], size)
        latencies.append((time.perf_counter() - t0) * 1000)
    return percentile(latencies, 50)


def reregister_ms(kubelet: KubeletSim) -> float:
    count = len(kubelet.registrations)
    kubelet.stop()
    t0 = time.monotonic()
    kubelet.start()
    wait_until(lambda: len(kubelet.registrations) > count)
    return float((kubelet.registrations[count]["monotonic"] - t0) * 1000)


def xid_ms(run: Running, events: int = 7) -> float:
    """Median of `events` XIDs, one GPU at a time, once the plugin has settled after start-up."""
    node = run.node
    assert node is not None
    count = len(node.inventory.gpus)
    run.kubelet.wait_for_resource(RESOURCE, count=count, healthy=count, timeout=30)
    time.sleep(1.0)  # steady state: start-up work (health registration, first streams) is over
    latencies = []
    for n in range(min(events, count)):
        t0 = time.monotonic()
        node.inject_xid(node.inventory.gpus[n].uuid, 48)
        run.kubelet.wait_for_resource(RESOURCE, count=count, healthy=count - 1 - n, timeout=15)
        latencies.append((time.monotonic() - t0) * 1000)
        time.sleep(0.2)
    return statistics.median(latencies)


# --- nvdp alone, on the stand-in -------------------------------------------------------------------


def warm_bytecode() -> None:
    """One start that writes nvdp's bytecode cache, so measured starts read compiled modules."""
    with plugin("t4") as run:
        wait_until(lambda: bool(run.kubelet.registrations))


def bench_start(runs: int) -> Row:
    times = []
    for _ in range(runs):
        with plugin("t4") as run:
            wait_until(lambda: bool(run.kubelet.registrations))
            times.append(run.kubelet.registrations[0]["monotonic"] - run.started_at)
    value = statistics.median(times) * 1000
    return Row("start -> registered (median)", "150 ms", f"{value:.0f} ms", value <= 150)


def bench_runtime(calls: int) -> list[Row]:
    rows = []
    with plugin("t4") as run:
        kubelet = run.kubelet
        devices = kubelet.wait_for_resource(RESOURCE, count=1, timeout=15)
        latencies = allocate_latencies(kubelet, devices[0]["id"], calls)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        rows.append(Row(f"Allocate p50 ({calls} calls)", "0.45 ms", f"{p50:.2f} ms", p50 <= 0.45))
        rows.append(Row(f"Allocate p99 ({calls} calls)", "0.8 ms", f"{p99:.2f} ms", p99 <= 0.8))

        time.sleep(max(0.0, 5.0 - (time.monotonic() - run.started_at)))
        hwm = proc_status_mib(run.process.pid, "VmHWM")
        rows.append(Row("plugin VmHWM after 5 s", "38 MiB", f"{hwm:.1f} MiB", hwm <= 38))

        value = reregister_ms(kubelet)
        rows.append(Row("kubelet.sock re-created -> re-registered", "20 ms", f"{value:.1f} ms", value <= 20))

        value = xid_ms(run)
        rows.append(Row("XID -> Unhealthy seen by the kubelet", "1.2 ms", f"{value:.1f} ms", value <= 1.2))
    return rows


def bench_preferred(calls: int) -> list[Row]:
    rows = []
    for label, config, count in (("8 GPUs x 128 replicas", REPLICAS_128, 1024),
                                 ("8 A100 NVLink, whole GPUs", None, 8)):
        with plugin("a100-sxm-8", config) as run:
            devices = run.kubelet.wait_for_resource(RESOURCE, count=count, timeout=30)
            p50 = preferred_p50(run.kubelet, [d["id"] for d in devices], 4, calls)
            rows.append(Row(f"GetPreferredAllocation p50, {label}, size 4", "2 ms", f"{p50:.2f} ms",
                            p50 <= 2))
    return rows


def print_table(rows: list[Row]) -> None:
    header = ("metric", "target", "measured", "result")
    print_rows([header, *((r.metric, r.target, r.measured, "pass" if r.ok else "FAIL") for r in rows)])


def print_rows(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


# --- what metrics and probes cost ------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")
# The chart's default probe periods: readiness every 10 s, liveness every 30 s.
PROBES_PER_HOUR = 3600 // 10 + 3600 // 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS  # utime + stime


def http_cpu_ms(pid: int, port: int, path: str, calls: int) -> float:
    """The plugin's CPU milliseconds per GET of `path` on its HTTP server."""
    def get() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            response.read()

    get()
    before = cpu_ms(pid)
    for _ in range(calls):
        get()
    return (cpu_ms(pid) - before) / calls


def bench_metrics(calls: int, probe_calls: int) -> list[Row]:
    """nvdp plain and with metrics and probes served, side by side; Allocate calls alternate between the
    two in batches of 50, so load falls on both alike."""
    port = free_port()
    served = (f"--metrics-address=127.0.0.1:{port}", f"--health-address=127.0.0.1:{port}")
    with plugin("t4") as plain, plugin("t4", args=served) as metrics:
        runs = (plain, metrics)
        ids = [run.kubelet.wait_for_resource(RESOURCE, count=1, timeout=15)[0]["id"] for run in runs]
        for run, device in zip(runs, ids, strict=True):
            allocate_latencies(run.kubelet, device, 50)  # warm-up: connections, first-call imports
        latencies: tuple[list[float], list[float]] = ([], [])
        for _ in range(max(1, calls // 50)):
            for run, device, out in zip(runs, ids, latencies, strict=True):
                out += allocate_latencies(run.kubelet, device, 50)
        readyz = http_cpu_ms(metrics.process.pid, port, "/readyz", probe_calls)
        healthz = http_cpu_ms(metrics.process.pid, port, "/healthz", probe_calls)
        scrape = http_cpu_ms(metrics.process.pid, port, "/metrics", probe_calls)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - metrics.started_at)))
        hwm = [proc_status_mib(run.process.pid, "VmHWM") for run in runs]
    added = percentile(latencies[1], 50) - percentile(latencies[0], 50)
    probes = (readyz * (3600 // 10) + healthz * (3600 // 30)) / 36_000  # % of one core
    return [
        Row(f"Allocate p50 without / with metrics ({calls} calls)", "-",
            f"{percentile(latencies[0], 50):.3f} / {percentile(latencies[1], 50):.3f} ms", True),
        Row("Allocate p50 added by metrics", "0.05 ms", f"{added:+.3f} ms", added <= 0.05),
        Row("plugin CPU per /readyz", "1 ms", f"{readyz:.2f} ms", readyz <= 1),
        Row("plugin CPU per /healthz (calls each gRPC server)", "5 ms", f"{healthz:.2f} ms", healthz <= 5),
        Row(f"probe CPU at the chart's periods ({PROBES_PER_HOUR}/h)", "0.01 % of a core", f"{probes:.4f} %",
            probes <= 0.01),
        Row("plugin CPU per /metrics scrape", "5 ms", f"{scrape:.2f} ms", scrape <= 5),
        Row("VmHWM after 5 s without / with metrics", "50 MiB with", f"{hwm[0]:.1f} / {hwm[1]:.1f} MiB",
            hwm[1] <= 50),
    ]


# --- CDI spec generation ---------------------------------------------------------------------------

# The versioned libraries of a 550 driver (.run install, x86_64), each a small ELF file with its SONAME.
CDI_LIBRARIES = (
    "libcuda", "libcudadebugger", "libnvcuvid", "libnvidia-allocator", "libnvidia-cfg", "libnvidia-eglcore",
    "libnvidia-encode", "libnvidia-fbc", "libnvidia-glcore", "libnvidia-glsi", "libnvidia-glvkspirv",
    "libnvidia-gpucomp", "libnvidia-ml", "libnvidia-ngx", "libnvidia-nvvm", "libnvidia-opencl",
    "libnvidia-opticalflow", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-ptxjitcompiler",
    "libnvidia-rtcore", "libnvidia-tls", "libnvidia-wayland-client", "libnvoptix", "libGLX_nvidia",
    "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-vulkan-producer",
)  # fmt: skip
CDI_OTHER_FILES = 1500  # the rest of a distribution's library folder, which every glob there walks
CDI_LIB_DIR = "usr/lib/x86_64-linux-gnu"
CDI_CAPS_MAJOR = 237
CDI_PROFILES = (("a100-sxm-8", "8 GPUs"), ("h100-mig-single", "8 GPUs, 56 MIG devices"))
# What the child prints: the import of nvdp.cdi on top of what the plugin has loaded anyway (logging, re,
# msgspec, config, inventory, plan), then the first generation, both in ms.
CDI_COLD = """
import logging, re, sys, time
import msgspec
from nvdp.config.model import Config
from nvdp.inventory.model import Inventory
from nvdp.plan import plan
t0 = time.perf_counter()
import nvdp.cdi, nvdp.cdi.host
t1 = time.perf_counter()
config = msgspec.json.decode(open(sys.argv[1], "rb").read(), type=Config)
inventory = msgspec.json.decode(open(sys.argv[2], "rb").read(), type=Inventory)
planned = plan(config, inventory)
t2 = time.perf_counter()
nvdp.cdi.build_specs(config, inventory, planned, nvdp.cdi.host.discover_host(config, inventory,
                     sysfs_root=sys.argv[3], proc_root=sys.argv[4]))
t3 = time.perf_counter()
print((t1 - t0) * 1000, (t3 - t2) * 1000)
"""


def _cdi_node(work: Path, inventory: Inventory) -> tuple[Path, Path]:
    """A driver root and /proc for `inventory`: real nodes (mknod), ELF libraries, binaries, firmware."""
    from scripts.cdi_golden import elf_stub  # the golden script's tiny ELF library

    root, proc = work / "root", work / "proc"
    lib = root / CDI_LIB_DIR
    (lib / "vdpau").mkdir(parents=True)
    version = inventory.driver_version
    for name in CDI_LIBRARIES:
        elf_stub(lib / f"{name}.so.{version}", f"{name}.so.1", work)
        if name != "libnvidia-ml":  # the plugin would load this stub as its NVML: it takes the stand-in's
            (lib / f"{name}.so.1").symlink_to(f"{name}.so.{version}")
    elf_stub(lib / "vdpau" / f"libvdpau_nvidia.so.{version}", "libvdpau_nvidia.so.1", work)
    for n in range(CDI_OTHER_FILES):
        (lib / f"libother{n}.so.1").write_bytes(b"")
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                   "nvidia-cuda-mps-server", "nvidia-ctk"):
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/bin" / binary).write_bytes(b"")
        os.chmod(root / "usr/bin" / binary, 0o755)
    (root / f"lib/firmware/nvidia/{version}").mkdir(parents=True)
    (root / f"lib/firmware/nvidia/{version}/gsp_ga10x.bin").write_bytes(b"")
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    nodes = [("nvidiactl", 195, 255), ("nvidia-uvm", 235, 0), ("nvidia-uvm-tools", 235, 1),
             ("nvidia-modeset", 195, 254)]
    minors = []
    for gpu in inventory.gpus:
        nodes.append((f"nvidia{gpu.minor}", 195, gpu.minor))
        for mig in gpu.mig_devices:
            gi = 3 + 135 * gpu.minor + 9 * mig.gi_id
            ci = gi + 1 + mig.ci_id
            gi_key = f"gpu{gpu.minor}/gi{mig.gi_id}"
            minors += [f"{gi_key}/access {gi}", f"{gi_key}/ci{mig.ci_id}/access {ci}"]
            nodes += [(f"nvidia-caps/nvidia-cap{m}", CDI_CAPS_MAJOR, m) for m in (gi, ci)]
    for name, major, minor in nodes:
        os.mknod(dev / name, 0o20666, os.makedev(major, minor))
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "driver/nvidia-caps/mig-minors").write_text("\n".join(["config 1", "monitor 2", *minors]) + "\n")
    (proc / "devices").write_text(f"Character devices:\n195 nvidia\n{CDI_CAPS_MAJOR} nvidia-caps\n")
    return root, proc


def bench_cdi(repeats: int, starts: int) -> list[Row]:
    """CDI spec generation (driver files, nodes, specs) for 8 GPUs and for 8 GPUs with 56 MIG devices,
    cold (a fresh interpreter: importing nvdp.cdi, then the first generation) and warm (median of
    `repeats` in one process), against the plugin's spawn -> registered on the same profile."""
    import msgspec

    from nvdp.cdi.build import build_specs
    from nvdp.cdi.host import discover_host
    from nvdp.config.model import Config, Flags, PluginFlags
    from nvdp.plan import plan as make_plan

    rows = []
    for profile, label in CDI_PROFILES:
        inventory = NodeSim(profile, Path(tempfile.mkdtemp(prefix="nvdp-bench-state-"))).inventory
        with tempfile.TemporaryDirectory(prefix="nvdp-bench-cdi-") as tmp:
            work = Path(tmp)
            root, proc = _cdi_node(work, inventory)
            plugin_flags = PluginFlags(device_list_strategy=("cdi-cri",), container_driver_root=str(root))
            config = Config(flags=Flags(mig_strategy="mixed", plugin=plugin_flags))
            (work / "config.json").write_bytes(msgspec.json.encode(config))
            (work / "inventory.json").write_bytes(msgspec.json.encode(inventory))
            planned = make_plan(config, inventory)
            warm_discover, warm_build = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                facts = discover_host(config, inventory, sysfs_root=str(work / "sys"), proc_root=str(proc))
                t1 = time.perf_counter()
                specs = build_specs(config, inventory, planned, facts)
                warm_discover.append((t1 - t0) * 1000)
                warm_build.append((time.perf_counter() - t1) * 1000)
            devices = len(specs.specs[0].devices)
            cold_import, cold_generate = [], []
            argv = [sys.executable, "-c", CDI_COLD, str(work / "config.json"), str(work / "inventory.json"),
                    str(work / "sys"), str(proc)]
            for _ in range(starts):
                out = subprocess.run(argv, env=nvdp_env(work, None), capture_output=True, text=True,
                                     check=True)
                imported, generated = map(float, out.stdout.split())
                cold_import.append(imported)
                cold_generate.append(generated)
            # The plugin itself, CDI off and (without MIG: it reads the machine's own /proc) cdi-cri on this
            # root, starts interleaved so both see the same load.
            cdi_env = {"DEVICE_LIST_STRATEGY": "cdi-cri", "DRIVER_ROOT_CTR_PATH": str(root),
                       "NVDP_CDI_DIR": str(work / "cdi")}
            with_cdi = not any(g.mig_devices for g in inventory.gpus)
            spawn: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(starts):
                for cdi_on in (False, True) if with_cdi else (False,):
                    with plugin(profile, extra_env=cdi_env if cdi_on else None) as run:
                        wait_until(lambda: bool(run.kubelet.registrations))
                        registered = run.kubelet.registrations[0]["monotonic"]
                        spawn[cdi_on].append((registered - run.started_at) * 1000)
        cold = statistics.median(cold_import) + statistics.median(cold_generate)
        start = statistics.median(spawn[False])
        rows += [
            Row(f"{label}: warm discovery + build ({devices} devices, median of {repeats})", "-",
                f"{statistics.median(warm_discover):.1f} + {statistics.median(warm_build):.1f} ms", True),
            Row(f"{label}: cold import + first generation (median of {starts})", "-",
                f"{statistics.median(cold_import):.1f} + {statistics.median(cold_generate):.1f} ms", True),
            Row(f"{label}: spawn -> registered, CDI off (median of {starts})", "-", f"{start:.0f} ms", True),
            Row(f"{label}: cold CDI as a share of that start", "25 %", f"{cold / start * 100:.0f} %",
                cold / start <= 0.25),
        ]
        if with_cdi:
            on = statistics.median(spawn[True])
            rows.append(Row(f"{label}: spawn -> registered, cdi-cri (writes the spec; median of {starts})",
                            "-", f"{on:.0f} ms ({on - start:+.0f})", True))
    return rows


# --- side by side with NVIDIA's plugin --------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    target: Callable[[float, float], bool]  # (nvdp, NVIDIA) -> met
    target_text: str


FIGURES = (
    Figure("start", "spawn -> registered", "ms", lambda ours, _theirs: ours <= 150, "<= 150 ms"),
    Figure("hwm", "VmHWM after 5 s", "MiB", lambda ours, _theirs: ours <= 38, "<= 38 MiB"),
    Figure("alloc_p50", "Allocate p50 (sequential)", "ms", lambda ours, _t: ours <= 0.45, "<= 0.45 ms"),
    Figure("alloc_p99", "Allocate p99 (sequential)", "ms", lambda ours, _t: ours <= 0.8, "<= 0.8 ms"),
    Figure("xid", "XID -> Unhealthy (stand-in NVML, both)", "ms", lambda ours, _t: ours <= 1.2, "<= 1.2 ms"),
    Figure("pref_8", "GetPreferredAllocation 8 GPUs, size 8", "ms", lambda ours, theirs: ours <= theirs,
           "<= NVIDIA"),
    Figure("pref_1024", "GetPreferredAllocation 8x128 replicas, size 8", "ms",
           lambda ours, theirs: ours <= theirs / 4, "<= 1/4 NVIDIA"),
    Figure("rereg", "kubelet.sock recreated -> re-registered", "ms", lambda ours, theirs: ours <= theirs,
           "<= NVIDIA"),
)


def why_nvidia_cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "NVIDIA's plugin needs root: run_in_ns.sh makes a private mount namespace (unshare -m)"
    if shutil.which("unshare") is None:
        return "unshare(1) is missing; NVIDIA's plugin needs it for its mount namespace"
    if not (UPSTREAM_DIR / "setup.sh").is_file():
        return f"{UPSTREAM_DIR} (NVIDIA's plugin and mock NVML) is not there"
    # The mock shows only the GPUs whose /dev/nvidia<N> exists when some do (its "visibility filtering"),
    # so a node left on this machine by another test would shrink the 8 GPUs the figures are taken on.
    nodes = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    if nodes:
        verb = "exists" if len(nodes) == 1 else "exist"
        return (f"{', '.join(nodes)} {verb} on this machine, and NVIDIA's mock NVML then shows only the GPUs "
                "whose node exists; remove them (they are not a real GPU's here) to compare on 8 GPUs")
    return None


def unpack_upstream() -> Path:
    # Into this checkout's .build (unless UPSTREAM_DIR is set): never another checkout's half-written file.
    env = {"UPSTREAM_DIR": str(ROOT / ".build" / "nvidia-upstream"), **os.environ}
    out = subprocess.run(["bash", str(UPSTREAM_DIR / "setup.sh")], check=True, capture_output=True, text=True,
                         env=env)
    return Path(out.stdout.strip().splitlines()[-1])


def measure_one(kind: str, upstream: Path, calls: int, pref_calls: int, src: Path | None) -> dict[str, float]:
    """The FIGURES of one plugin; the floor does not re-register, so it has no rereg."""
    floor = kind == FLOOR
    figures: dict[str, float] = {}
    starts = []
    for _ in range(STARTS_PER_ROUND - 1):  # the last start is the long-running process below
        with plugin(None, kind=kind, upstream=upstream, src=src) as run:
            wait_until(lambda: bool(run.kubelet.registrations))
            starts.append((run.kubelet.registrations[0]["monotonic"] - run.started_at) * 1000)
    with plugin(None, kind=kind, upstream=upstream, src=src) as run:
        kubelet = run.kubelet
        wait_until(lambda: bool(kubelet.registrations))
        starts.append((kubelet.registrations[0]["monotonic"] - run.started_at) * 1000)
        figures["start"] = statistics.median(starts)
        devices = kubelet.wait_for_resource(RESOURCE, count=8, timeout=30)
        ids = [d["id"] for d in devices]
        latencies = allocate_latencies(kubelet, ids[0], calls)
        figures["alloc_p50"] = percentile(latencies, 50)
        figures["alloc_p99"] = percentile(latencies, 99)
        figures["pref_8"] = preferred_p50(kubelet, ids, 8, pref_calls)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - run.started_at)))
        figures["hwm"] = proc_status_mib(run.process.pid, "VmHWM")
        if not floor:
            figures["rereg"] = reregister_ms(kubelet)
    replicas = {"FLOOR_REPLICAS": "128"} if floor else None  # the floor's stand-in for REPLICAS_128
    with plugin(None, REPLICAS_128, kind=kind, upstream=upstream, src=src, extra_env=replicas) as run:
        devices = run.kubelet.wait_for_resource(RESOURCE, count=1024, timeout=30)
        figures["pref_1024"] = preferred_p50(run.kubelet, [d["id"] for d in devices], 8, pref_calls)
    with plugin("a100-sxm-8", kind=kind, upstream=upstream, src=src) as run:
        figures["xid"] = xid_ms(run)
    return figures


def against_nvidia(runs: int, calls: int, pref_calls: int, baselines: dict[str, Path]) -> int:
    reason = why_nvidia_cannot_run()
    if reason is not None:
        print(f"skipped --against-nvidia: {reason}")
        return 0
    upstream = unpack_upstream()
    warm_bytecode()
    kinds = [NVIDIA, *baselines, NVDP, FLOOR]
    for label, src in [*baselines.items(), (FLOOR, None)]:
        with plugin("t4", kind=label, src=src) as run:  # its bytecode, as for nvdp
            wait_until(lambda: bool(run.kubelet.registrations))
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    loads = [load_average()]
    for round_no in range(runs):
        # Each plugin goes first, middle and last equally often, so all see the same load.
        order = kinds[round_no % len(kinds):] + kinds[:round_no % len(kinds)]
        for kind in order:
            results[kind].append(measure_one(kind, upstream, calls, pref_calls, baselines.get(kind)))
        loads.append(load_average())
    print(f"{runs} interleaved rounds, medians; {calls} Allocate and {pref_calls} GetPreferredAllocation "
          "calls per round; NVIDIA's mock NVML (8x A100) except XID")
    for label, src in baselines.items():
        print(f"{label}: nvdp from {src}")
    print(f"{FLOOR}: bench/floor_plugin.py, the least a Python plugin must do (8x128: FLOOR_REPLICAS=128); "
          "it does not re-register: '-'")
    print(f"load average (1/5/15 min) before and after each round: {' | '.join(loads)}\n")
    print_rows(comparison_table(kinds, results))
    return 0


def ratio(ours: float, other: float | None) -> str:
    return f"{ours / other:.2f}" if other else "-"


def comparison_table(kinds: list[str], results: dict[str, list[dict[str, float]]]) -> list[tuple[str, ...]]:
    """Medians per figure and plugin; a figure a plugin does not have (the floor's) shows as "-"."""
    header = ("figure", *kinds, "nvdp/NVIDIA", "nvdp/floor", "nvdp target", "met")
    table: list[tuple[str, ...]] = [header]
    for figure in FIGURES:
        medians = {kind: statistics.median(r[figure.key] for r in results[kind])
                   for kind in kinds if results[kind] and figure.key in results[kind][0]}
        theirs, ours, floor = medians[NVIDIA], medians[NVDP], medians.get(FLOOR)
        digits = 2 if figure.unit == "ms" and max(medians.values()) < 10 else 1
        table.append((
            figure.label,
            *(f"{medians[kind]:.{digits}f} {figure.unit}" if kind in medians else "-" for kind in kinds),
            ratio(ours, theirs),
            ratio(ours, floor),
            figure.target_text,
            "yes" if figure.target(ours, theirs) else "NO",
        ))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark the plugin process with the stand-ins.")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--metrics", action="store_true",
                        help="nvdp plain and with metrics and probes served: what they cost")
    parser.add_argument("--against-nvidia", action="store_true",
                        help="run NVIDIA's plugin v0.20.0 and nvdp alternately and compare (needs root)")
    parser.add_argument("--cdi", action="store_true",
                        help="CDI spec generation for 8 GPUs and 8 GPUs with 56 MIG devices (root: mknod)")
    parser.add_argument("--runs", type=int, default=5, help="interleaved rounds for --against-nvidia")
    parser.add_argument("--baseline", action="append", default=[], metavar="LABEL=DIR",
                        help="with --against-nvidia: also run nvdp from this src/ folder (e.g. an earlier "
                             "commit's, from `git archive`) in the same rounds, as column LABEL; repeatable")
    args = parser.parse_args(argv)
    build_library()
    calls = 100 if args.quick else 1000
    pref_calls = 20 if args.quick else 200
    try:
        if args.against_nvidia:
            baselines = {}
            for spec in args.baseline:
                label, sep, folder = spec.partition("=")
                if not sep or not label or not folder:
                    parser.error(f"--baseline {spec!r}: expected LABEL=DIR")
                baselines[label] = Path(folder)
            return against_nvidia(1 if args.quick else args.runs, calls, pref_calls, baselines)
        warm_bytecode()
        print(f"load average: {load_average()}")
        if args.cdi:
            if os.geteuid() != 0:
                print("skipped --cdi: the fake driver root's device nodes need root (mknod)")
                return 0
            rows = bench_cdi(20 if args.quick else 200, 3 if args.quick else 7)
        elif args.metrics:
            rows = bench_metrics(calls * 2, 50 if args.quick else 500)
        else:
            rows = [bench_start(1 if args.quick else 5)]
            rows += bench_runtime(calls)
            rows += bench_preferred(pref_calls)
    except (TimeoutError, RuntimeError, OSError, subprocess.CalledProcessError) as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print(f"load average: {load_average()}")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
