"""What each daemon of the chart costs a node: resident memory and CPU, for the chart's resource defaults.

    .venv/bin/python bench/footprint_bench.py                       # the four daemons, 60 s each
    .venv/bin/python bench/footprint_bench.py --seconds 20 --profile t4

Each daemon runs unmodified, from compiled bytecode as the image ships it (plugin_bench.py's cache), on
the stand-in NVML (default profile a100-sxm-8: 8 GPUs) beside a throwaway etcd + kube-apiserver
(`tests/kube/envtest.py`; root and `$KUBEBUILDER_ASSETS`, as for the tests), in the chart's heavier
configuration: per-node config (a directory of entries, the Node watched for its label), probes on and
metrics on. What each does while measured:

- device plugin: registered with the kubelet simulator, time-slicing x4 (32 devices); Allocate calls,
  `/healthz` and `/readyz` every second and a `/metrics` scrape every 5 s;
- MPS control daemon: an entry sharing every GPU with MPS (x4), one control daemon per resource (the
  stand-in `nvidia-cuda-mps-control`, a Python script, where NVIDIA's is a small C program);
- GPU feature discovery: labelling the Node through the API server, NVML re-checked every 5 s (the
  chart's default is 60 s);
- DRA plugin: its slices published, a claim of one GPU prepared and unprepared every 2 s over its socket,
  `/healthz` every second.

The window is split in two: first the daemon alone (its watches, health checks and NVML re-checks),
then driven as above. Sampled every 0.25 s from /proc: the daemon process's VmRSS and VmHWM, and the CPU
time (utime + stime) of the daemon and of its child processes (stand-in helpers: listed apart, since on
a node NVIDIA's binaries take their place). Printed per daemon: CPU seconds until ready (start-up),
millicores over the idle half, over the driven half and over the busiest 5 s, VmHWM at the end (the
peak), VmRSS at the end, and the children's peak RSS and CPU. A first pass of 2 s per daemon, not
printed, fills the bytecode cache.

The stand-in NVML is a small C library; NVIDIA's libnvidia-ml.so maps more (bench/RESULTS.md says what
headroom the chart adds for it). Exit status 0 with the table; 1 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from sim.kubelet import KubeletSim  # noqa: E402
from sim.nvml import NodeSim  # noqa: E402

PYCACHE = ROOT / ".build" / "bench-pycache"
TICK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
SAMPLE_S = 0.25
DRIVER = "gpu.nvidia.com"
LABEL = "nvidia.com/device-plugin.config"
PLAIN = "version: v1\n"
SHARED = ("version: v1\nsharing:\n  {kind}:\n    resources:\n      - name: nvidia.com/gpu\n"
          "        replicas: 4\n")
ENTRY_POINTS = {
    "device plugin": "nvdp.plugin.main",
    "MPS control daemon": "nvdp.mps.main",
    "GPU feature discovery": "nvdp.gfd.main",
    "DRA plugin": "nvdp.dra.main",
}


@dataclass
class Sample:
    at: float
    rss_kib: int
    hwm_kib: int
    cpu_s: float
    children_rss_kib: int
    children_cpu_s: float


@dataclass
class Result:
    name: str
    ready_cpu_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    driven_from: float = 0.0  # when the idle half ended

    def millicores(self) -> tuple[float, float, float]:
        """Mean over the idle half, over the driven half, and the busiest 5 s of the window."""
        idle = [s for s in self.samples if s.at <= self.driven_from]
        driven = [s for s in self.samples if s.at >= self.driven_from]

        def mean(part: list[Sample]) -> float:
            return (part[-1].cpu_s - part[0].cpu_s) / (part[-1].at - part[0].at) * 1000

        busiest = 0.0
        for i, start in enumerate(self.samples):
            for end in self.samples[i + 1:]:
                if end.at - start.at >= 5.0:
                    busiest = max(busiest, (end.cpu_s - start.cpu_s) / (end.at - start.at) * 1000)
                    break
        return mean(idle), mean(driven), busiest


def children_of(pid: int) -> list[int]:
    """Every descendant of `pid`, from /proc's parent links."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def status_kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid: int, result: Result) -> None:
        super().__init__(daemon=True)
        self.pid, self.result, self.stop = pid, result, threading.Event()
        self.children_cpu: dict[int, float] = {}

    def sample(self) -> Sample:
        rss = status_kib(self.pid, "VmRSS")
        hwm = status_kib(self.pid, "VmHWM")
        own = cpu_s(self.pid)
        children_rss = 0
        for child in children_of(self.pid):
            try:
                children_rss += status_kib(child, "VmRSS")
                self.children_cpu[child] = cpu_s(child)
            except OSError:
                continue
        return Sample(time.monotonic(), rss, hwm, own, children_rss, sum(self.children_cpu.values()))

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            try:
                self.result.samples.append(self.sample())
            except OSError:
                return


def base_env(node: NodeSim, plane_kubeconfig: Path, node_name: str, entries: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "CONFIG_FILE")}
    env.update(node.env)
    env.update({
        "PYTHONPATH": str(ROOT / "src"), "PYTHONPYCACHEPREFIX": str(PYCACHE), "PYTHONUNBUFFERED": "1",
        "NODE_NAME": node_name, "KUBECONFIG": str(plane_kubeconfig), "CONFIG_DIR": str(entries),
    })
    return env


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            answer.read()
    except OSError:
        pass


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"exited ({proc.returncode}) before {text!r}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {text!r} within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)


@contextmanager
def daemon(name: str, env: dict[str, str], work: Path, args: tuple[str, ...] = ()) -> Iterator[
        tuple[subprocess.Popen[bytes], Path]]:
    entry = f"import sys\nfrom {ENTRY_POINTS[name]} import main\nsys.exit(main())"
    log = work / f"{name.replace(' ', '-')}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", entry, *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def measure(name: str, proc: subprocess.Popen[bytes], ready: Callable[[], None], drive: Callable[[], None],
            seconds: float) -> Result:
    result = Result(name)
    ready()
    result.ready_cpu_s = cpu_s(proc.pid)
    sampler = Sampler(proc.pid, result)
    sampler.start()
    result.driven_from = time.monotonic() + seconds / 2
    time.sleep(seconds / 2)  # idle: only what the daemon does by itself (watches, health, NVML re-checks)
    stop_at = time.monotonic() + seconds / 2
    while time.monotonic() < stop_at:
        drive()
    sampler.stop.set()
    sampler.join()
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited ({proc.returncode}) while measured")
    return result


def every(period_s: float, action: Callable[[], None]) -> Callable[[], None]:
    """A drive step: `action`, then sleep out the rest of the period."""
    def step() -> None:
        started = time.monotonic()
        action()
        time.sleep(max(0.0, period_s - (time.monotonic() - started)))
    return step


def bench_plugin(node: NodeSim, env: dict[str, str], work: Path, seconds: float) -> Result:
    plugin_dir = work / "device-plugins"
    plugin_dir.mkdir()
    health, metrics = free_port(), free_port()
    env = {**env, "DEVICE_PLUGIN_PATH": str(plugin_dir), "HEALTH_ADDRESS": f"127.0.0.1:{health}",
           "METRICS_ADDRESS": f"127.0.0.1:{metrics}", "DEFAULT_CONFIG": "ts"}
    count = len(node.inventory.gpus) * 4
    with KubeletSim(plugin_dir) as kubelet, daemon("device plugin", env, work) as (proc, _log):
        state = {"n": 0}

        def ready() -> None:
            kubelet.wait_for_resource("nvidia.com/gpu", count=count, timeout=60)

        def step() -> None:
            state["n"] += 1
            devices = kubelet.wait_for_resource("nvidia.com/gpu", count=count, timeout=10)
            for _ in range(20):
                kubelet.allocate("nvidia.com/gpu", [[devices[state["n"] % count]["id"]]])
            get(f"http://127.0.0.1:{health}/healthz")
            get(f"http://127.0.0.1:{health}/readyz")
            if state["n"] % 5 == 0:
                get(f"http://127.0.0.1:{metrics}/metrics")

        return measure("device plugin", proc, ready, every(1.0, step), seconds)


def bench_mps(node: NodeSim, env: dict[str, str], work: Path, seconds: float) -> Result:
    from sim.mps import BIN_DIR

    root = work / "mps"
    root.mkdir()
    metrics = free_port()
    env = {**env, "PATH": f"{BIN_DIR}:{os.environ['PATH']}", "MPS_ROOT": str(root),
           "MPS_CONTAINER_ROOT": str(root), "DEFAULT_CONFIG": "mps",
           "METRICS_ADDRESS": f"127.0.0.1:{metrics}"}
    with daemon("MPS control daemon", env, work) as (proc, log):
        return measure("MPS control daemon", proc, lambda: wait_for(log, "Config in force: ", proc),
                       every(5.0, lambda: get(f"http://127.0.0.1:{metrics}/metrics")), seconds)


def bench_gfd(node: NodeSim, env: dict[str, str], work: Path, seconds: float) -> Result:
    env = {**env, "DEFAULT_CONFIG": "ts", "POD_NAME": "gfd-bench", "NAMESPACE": "default"}
    with daemon("GPU feature discovery", env, work, ("--sleep-interval", "5s")) as (proc, log):
        return measure("GPU feature discovery", proc, lambda: wait_for(log, "labels changed", proc),
                       every(1.0, lambda: None), seconds)


def bench_dra(node: NodeSim, env: dict[str, str], work: Path, seconds: float, plane: object) -> Result:
    from tests.integration.cdi_node import make_cdi_node
    from tests.integration.test_dra_metrics import allocated_claim, call

    sockets = Path(tempfile.mkdtemp(prefix="nvdp-fp-", dir="/tmp"))  # unix socket paths stay short
    cdi = make_cdi_node(work / "cdi-node", node.inventory)
    health, metrics = free_port(), free_port()
    env = {**env, **cdi.env, "CDI_ROOT": str(cdi.cdi_dir), "DEFAULT_CONFIG": "plain",
           "KUBELET_PLUGINS_DIR": str(sockets / "plugins"),
           "KUBELET_REGISTRAR_DIR": str(sockets / "registry"),
           "HEALTH_ADDRESS": f"127.0.0.1:{health}", "METRICS_ADDRESS": f"127.0.0.1:{metrics}"}
    node_name = env["NODE_NAME"]
    socket = str(sockets / "plugins" / DRIVER / "dra.sock")
    try:
        with daemon("DRA plugin", env, work) as (proc, log):
            state = {"n": 0}

            def step() -> None:
                state["n"] += 1
                name = f"fp-{uuid.uuid4().hex[:8]}"
                uid = allocated_claim(plane, node_name, name, "gpu-0")  # type: ignore[arg-type]
                call(socket, "NodePrepareResources", (name, uid))
                call(socket, "NodeUnprepareResources", (name, uid))
                get(f"http://127.0.0.1:{health}/healthz")
                if state["n"] % 3 == 0:
                    get(f"http://127.0.0.1:{metrics}/metrics")

            return measure("DRA plugin", proc, lambda: wait_for(log, "Registration socket for", proc),
                           every(2.0, step), seconds)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def entries_dir(work: Path) -> Path:
    entries = work / "entries"
    entries.mkdir()
    for key, text in {"plain": PLAIN, "ts": SHARED.format(kind="timeSlicing"),
                      "mps": SHARED.format(kind="mps")}.items():
        (entries / key).write_text(text)
    return entries


def run(args: argparse.Namespace) -> list[Result]:
    from tests.kube.envtest import ControlPlane, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"no throwaway kube-apiserver: {reason}")
    results = []
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="nvdp-fp-kube-", dir=base) as tmp:
        plane = ControlPlane(Path(tmp))
        try:
            plane.start()
            benches: dict[str, Callable[..., Result]] = {
                "device plugin": bench_plugin, "MPS control daemon": bench_mps,
                "GPU feature discovery": bench_gfd, "DRA plugin": bench_dra,
            }
            # A first short pass writes the bytecode cache (compiling costs memory the image never pays).
            for seconds in (2.0, args.seconds):
                results = []
                for name, bench in benches.items():
                    if args.only and name not in args.only:
                        continue
                    with tempfile.TemporaryDirectory(prefix="nvdp-fp-") as work_dir:
                        work = Path(work_dir)
                        node_name = f"gpu-{uuid.uuid4().hex[:8]}"
                        plane.create_node(node_name)
                        with NodeSim(args.profile, work / "nvml") as node:
                            env = base_env(node, plane.admin_kubeconfig, node_name, entries_dir(work))
                            extra = (plane,) if name == "DRA plugin" else ()
                            results.append(bench(node, env, work, seconds, *extra))
                    print(f"  {name}: {seconds:.0f} s done", file=sys.stderr)
        finally:
            plane.stop()
    return results


def table(results: list[Result], args: argparse.Namespace) -> str:
    rows = [f"profile {args.profile}, {args.seconds:.0f} s each, load average "
            f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}, Python {sys.version.split()[0]}",
            "",
            "| daemon | CPU s to ready | millicores idle / driven / busiest 5 s | VmHWM MiB "
            "| VmRSS MiB (end) | stand-in children: peak RSS MiB, mean millicores |",
            "|---|---|---|---|---|---|"]
    for r in results:
        idle, driven, busiest = r.millicores()
        last = r.samples[-1]
        kids_peak = max(s.children_rss_kib for s in r.samples) / 1024
        kids_cpu = ((last.children_cpu_s - r.samples[0].children_cpu_s) / (last.at - r.samples[0].at) * 1000)
        rows.append(f"| {r.name} | {r.ready_cpu_s:.2f} | {idle:.1f} / {driven:.1f} / {busiest:.1f} "
                    f"| {last.hwm_kib / 1024:.1f} "
                    f"| {last.rss_kib / 1024:.1f} | {kids_peak:.1f}, {kids_cpu:.1f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per daemon")
    parser.add_argument("--profile", default="a100-sxm-8", help="stand-in NVML profile (sim/profiles)")
    parser.add_argument("--only", action="append", choices=sorted(ENTRY_POINTS), help="measure only these")
    parser.add_argument("--json", action="store_true", help="also print the samples' summary as JSON")
    args = parser.parse_args()
    try:
        results = run(args)
    except RuntimeError as err:
        print(f"footprint_bench: {err}", file=sys.stderr)
        return 1
    print(table(results, args))
    if args.json:
        print(json.dumps({r.name: {"ready_cpu_s": r.ready_cpu_s, "millicores": r.millicores(),
                                   "hwm_kib": r.samples[-1].hwm_kib} for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
