"""What the usage series cost a scrape: series count, bytes, scrape time and the plugin's CPU per scrape.

    .venv/bin/python bench/usage_bench.py                      # 8 GPUs x 16 pods, 200 scrapes a mode
    .venv/bin/python bench/usage_bench.py --gpus 8 --pods 16 --scrapes 500
    .venv/bin/python bench/usage_bench.py --quick              # 30 scrapes a mode, a smoke run

A node of `--gpus` stand-in GPUs (a100-sxm-8's, the first N), each shared by `--pods` pods (time-slicing
replicas in device-plugin mode, one claim each in DRA mode), each pod running `--procs` processes on its
GPU with memory and SM utilization (the stand-in NVML's `processes/<uuid>`), plus one process of no pod
per GPU. Around it, what the plugins read: a pod-resources gRPC server answering List as the kubelet
would (in this process), the kubelet's device checkpoint, the claims' `reservedFor`, and a proc tree in
which each process's cgroup and mounts are laid out as the kubelet's systemd cgroup driver and its
termination-log mount make them.

A server process of its own, on the stand-in NVML, serves `/metrics` with nvdp's HTTP server, its
series from the usage collector the plugins use (`nvdp.usage.collect.UsageCollector` and
`nvdp.usage.series`) in the plugin's registry. Each mode is scraped `--scrapes` times, one after another,
over HTTP, as Prometheus does:

- `off`: the plugin's own series only (no `--usage-metrics`), the baseline;
- `device-plugin`: the device plugin's usage (checkpoint, pod-resources, NVML, /proc);
- `dra`: the DRA plugin's (claims instead of the checkpoint; a claim's pods are read once, so the first
  scrape, which reads every claim, is shown on its own);
- `idle`: usage on, nothing held (the scrape reads the kubelet only, no NVML).

Per mode: usage series and all series in a scrape, its bytes, scrape time p50 / p95 / max (client
side), and the server's CPU per scrape (utime + stime from /proc over the scrapes). Prints a markdown
table and one JSON line; exit status 1 when a scrape fails or a usage figure is wrong (each pod's memory
is checked against what its processes were given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

MIB = 1 << 20
DRIVER = "gpu.nvidia.com"
RESOURCE = "nvidia.com/gpu"


def uid(gpu: int, pod: int) -> str:
    return f"{gpu:08x}-{pod:04x}-4000-8000-000000000000"


def pid_of(gpu: int, pod: int, proc: int) -> int:
    return 100_000 + gpu * 1000 + pod * 10 + proc


# --- the node around the plugin -----------------------------------------------------------------------

def build_node(state: Path, gpus: int, pods: int, procs: int) -> tuple[Any, dict[str, Any]]:
    """The stand-in node, its processes and the proc tree; what the kubelet would answer in each mode."""
    from sim.nvml import NodeSim, RunningProcess

    node = NodeSim("a100-sxm-8", state / "nvml")
    proc_root = state / "proc"
    expected: dict[str, int] = {}
    dp_pods, dra_pods, checkpoint, claims = [], [], [], {}
    for g, gpu in enumerate(node.inventory.gpus[:gpus]):
        running = [RunningProcess(999_000 + g, 64 * MIB)]  # no pod's: a host process
        on_host = proc_root / str(999_000 + g)
        on_host.mkdir(parents=True)
        (on_host / "cgroup").write_text("0::/system.slice/host.service\n")
        for p in range(pods):
            name, pod_uid = f"job-{g}-{p}", uid(g, p)
            for k in range(procs):
                pid = pid_of(g, p, k)
                running.append(RunningProcess(pid, (p + 1) * MIB * (k + 1), sm_util=(p + k) % 7))
                folder = proc_root / str(pid)
                folder.mkdir(parents=True)
                (folder / "cgroup").write_text(
                    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                    f"{pod_uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n")
                (folder / "mountinfo").write_text(
                    f"1 0 8:1 /var/lib/kubelet/pods/{pod_uid}/containers/main/0a1b /dev/termination-log rw "
                    "- ext4 /dev/sda1 rw\n")
            expected[name] = sum((p + 1) * MIB * (k + 1) for k in range(procs))
            replica = f"{gpu.uuid}::{p}"
            dp_pods.append((name, replica))
            checkpoint.append({"PodUID": pod_uid, "ContainerName": "main", "ResourceName": RESOURCE,
                               "DeviceIDs": {"-1": [replica]}, "AllocResp": ""})
            dra_pods.append((name, f"gpu-{gpu.minor}"))
            claims[f"default/{name}-gpu"] = {"status": {"reservedFor": [
                {"resource": "pods", "name": name, "uid": pod_uid}]}}
        node.set_processes(gpu.uuid, running)
    (state / "kubelet_internal_checkpoint").write_text(json.dumps({"Data": {"PodDeviceEntries": checkpoint}}))
    (state / "claims.json").write_text(json.dumps(claims))
    return node, {"expected": expected, "dp": dp_pods, "dra": dra_pods}


class Kubelet:
    """The kubelet's pod-resources List, answering what `mode` says is held."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.mode = "off"

    def answer(self) -> Any:
        from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb

        pods = []
        if self.mode in ("off", "device-plugin"):
            for name, replica in self.node["dp"]:
                held = pb.ContainerDevices(resource_name=RESOURCE, device_ids=[replica])
                pods.append(pb.PodResources(name=name, namespace="default", containers=[
                    pb.ContainerResources(name="main", devices=[held])]))
        elif self.mode == "dra":
            for name, device in self.node["dra"]:
                result = pb.ClaimResource(driver_name=DRIVER, pool_name="node-a", device_name=device)
                claim = pb.DynamicResource(claim_name=f"{name}-gpu", claim_namespace="default",
                                           claim_resources=[result])
                pods.append(pb.PodResources(name=name, namespace="default", containers=[
                    pb.ContainerResources(name="main", dynamic_resources=[claim])]))
        return pb.ListPodResourcesResponse(pod_resources=pods)

    def serve(self, path: str) -> Any:
        from nvdp.daemon.grpc_import import grpc
        from nvdp.daemon.podresources.api import podresources_v1_pb2_grpc as pb_grpc

        kubelet = self

        class Lister(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
            def List(self, request: Any, context: Any) -> Any:
                return kubelet.answer()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{path}")
        server.start()
        return server


# --- the server: a plugin's /metrics -----------------------------------------------------------------

def serve(settings: dict[str, Any]) -> None:
    """The server process: the plugin's registry, with the usage series in the mode given."""
    import logging

    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from nvdp.daemon.report import metrics
    from nvdp.daemon.report.endpoints import Response, start_endpoints
    from nvdp.dra.pool.names import device_uuids
    from nvdp.usage.collect import DraCounting, UsageCollector, UsageSource
    from nvdp.usage.series import UsageSeries

    mode = settings["mode"]
    log = logging.getLogger("bench")
    if mode != "off":
        def read_claim(namespace: str, name: str) -> Any:
            with open(settings["claims"]) as f:
                return json.load(f).get(f"{namespace}/{name}")

        source = UsageSource("node-a", settings["socket"], settings["proc_root"])
        checkpoint = settings["checkpoint"]
        collector = (UsageCollector(source, dra=DraCounting(DRIVER, device_uuids, read_claim), log=log)
                     if mode == "dra" else UsageCollector(source, checkpoint=lambda: checkpoint, log=log))
        metrics.PLUGIN.register(UsageSeries(collector, log))  # type: ignore[arg-type]
    # The plugin's own series as a serving plugin has them (8 devices x 16 replicas, registered).
    metrics.DEVICES.labels(RESOURCE, "healthy").set(128)
    metrics.DEVICES.labels(RESOURCE, "unhealthy").set(0)
    metrics.RESOURCE_REGISTERED.labels(RESOURCE).set(1)

    def route() -> Response:
        return Response(200, generate_latest(metrics.PLUGIN), CONTENT_TYPE_LATEST)

    (server,) = start_endpoints("127.0.0.1:0", None, {}, route, log)
    print(server.port, flush=True)
    sys.stdin.read()  # until the bench closes it
    server.stop()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> tuple[float, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        body: bytes = answer.read()
    return time.perf_counter() - start, body


def memory_by_pod(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("nvdp_pod_gpu_memory_used_bytes{"):
            pod = line.split('pod="', 1)[1].split('"', 1)[0]
            found[pod] = found.get(pod, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def run_mode(mode: str, node: Any, kubelet: Kubelet, state: Path, socket_path: str, scrapes: int,
             expected: dict[str, int]) -> dict[str, Any]:
    kubelet.mode = mode  # "idle": the kubelet lists no pod
    settings = {"mode": "off" if mode == "off" else ("dra" if mode == "dra" else "device-plugin"),
                "socket": socket_path, "proc_root": str(state / "proc"),
                "checkpoint": str(state / "kubelet_internal_checkpoint"),
                "claims": str(state / "claims.json")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
    env.update(node.env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src")])
    server = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(settings)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        first, body = scrape(port)
        text = body.decode()
        wanted = {k: float(v) for k, v in expected.items()}
        if mode in ("device-plugin", "dra") and memory_by_pod(text) != wanted:
            raise SystemExit(f"{mode}: the pods' memory is not what their processes were given")
        cpu_before = cpu_seconds(server.pid)
        times = []
        for _ in range(scrapes):
            took, body = scrape(port)
            times.append(took)
        cpu = (cpu_seconds(server.pid) - cpu_before) / scrapes
        text = body.decode()
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        usage = [line for line in samples if line.startswith(("nvdp_pod_gpu_", "nvdp_gpu_unattributed"))]
        times.sort()
        return {"mode": mode, "usage_series": len(usage), "series": len(samples), "bytes": len(body),
                "first_ms": first * 1000, "p50_ms": statistics.median(times) * 1000,
                "p95_ms": times[int(len(times) * 0.95) - 1] * 1000, "max_ms": times[-1] * 1000,
                "cpu_ms": cpu * 1000}
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=16, help="pods per GPU")
    parser.add_argument("--procs", type=int, default=2, help="processes per pod")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="30 scrapes a mode")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return 0
    scrapes = 30 if args.quick else args.scrapes
    with tempfile.TemporaryDirectory(prefix="nvdp-usage-bench-") as tmp:
        state = Path(tmp)
        node, held = build_node(state, args.gpus, args.pods, args.procs)
        kubelet = Kubelet(held)
        socket_path = str(state / "kubelet.sock")
        server = kubelet.serve(socket_path)
        try:
            rows = [run_mode(mode, node, kubelet, state, socket_path, scrapes, held["expected"])
                    for mode in ("off", "device-plugin", "dra", "idle")]
        finally:
            server.stop(None)
    load = os.getloadavg()[0]
    print(f"{args.gpus} GPUs x {args.pods} pods x {args.procs} processes, {scrapes} scrapes a mode; "
          f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{socket.gethostname()}, load average {load:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| mode | usage series | series | bytes | first scrape | p50 | p95 | max | server CPU per scrape |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['usage_series']} | {r['series']} | {r['bytes']} | "
              f"{r['first_ms']:.1f} ms | {r['p50_ms']:.1f} ms | {r['p95_ms']:.1f} ms | "
              f"{r['max_ms']:.1f} ms | {r['cpu_ms']:.1f} ms |")
    print(json.dumps({"gpus": args.gpus, "pods": args.pods, "procs": args.procs, "scrapes": scrapes,
                      "load": load, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
