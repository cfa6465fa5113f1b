"""What nvdp's ResourceSlices cost the real kube-scheduler: pods bound per second and scheduler CPU per pod.

Starts its own etcd, kube-apiserver and kube-scheduler (the k8s kit's v1.36.2 binaries by default) on free
loopback ports in a temporary directory, no kubelet; creates N fake Ready Nodes, each with the ResourceSlices
nvdp's pool functions publish for a node profile (`nvdp.dra.pool.contents.pool_devices` +
`nvdp.dra.pool.slices.desired_slices`, computed once per mode and re-targeted per node), the chart's
DeviceClasses (rendered with Helm's engine), then M ResourceClaims (one device each: a whole GPU, or a MIG
device of one profile) and M pods using them, created in a burst. A pod counts as bound once its
`spec.nodeName` is set.

    .venv/bin/python bench/scheduler_bench.py --nodes 50 --mode dynamic --pods 100
    .venv/bin/python bench/scheduler_bench.py --nodes 2 --pods 2                    # smoke run
    .venv/bin/python bench/scheduler_bench.py --mode whole --scheduler /path/to/kube-scheduler

Modes: whole (a100-sxm-8, migStrategy none: 8 GPUs per node), static (h100-mig-8, migStrategy mixed:
28 MIG devices), dynamic (h100-mig-8's eight H100s with MIG mode on and no MIG device, migStrategy dynamic:
every placement, 208 devices and 8 counter sets per node). `--profiles` narrows the MIG profiles offered
under dynamic MIG (config key flags.migDynamicProfiles) where this nvdp has that key.

Figures: pods bound per second (from the first pod created to the last bound), kube-scheduler CPU per pod
(utime + stime from /proc, from just before the claims are created until the last pod is bound), peak RSS
(VmHWM) of kube-scheduler and kube-apiserver, and the slices' JSON size in total. After `--timeout` seconds
of waiting for bindings it reports what it has. Prints one JSON line and one markdown table row.

Needs root (the kit's binaries are root-owned), openssl, and the kit set up (`k8s/setup.sh`):
etcd and kube-apiserver come from $KUBEBUILDER_ASSETS (default /tmp/nvdp-k8s/assets/bin), kube-scheduler
from $K8S_DIR/bin (default /tmp/nvdp-k8s/bin) unless `--scheduler` names another.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from nvdp.config.loader import load_config_text  # noqa: E402
from nvdp.dra.pool.contents import pool_devices  # noqa: E402
from nvdp.dra.pool.names import DEFAULT_DRIVER  # noqa: E402
from nvdp.dra.pool.slices import desired_slices, slice_name  # noqa: E402
from nvdp.inventory.model import Inventory  # noqa: E402
from nvdp.inventory.profile import inventory_from_profile  # noqa: E402
from sim.apiserver import make_pki  # noqa: E402

K8S_DIR = Path(os.environ.get("K8S_DIR", "/tmp/nvdp-k8s"))
ASSETS = Path(os.environ.get("KUBEBUILDER_ASSETS") or K8S_DIR / "assets" / "bin")
PROFILES = ROOT / "sim" / "profiles"
CHART = ROOT / "charts" / "nvidia-device-plugin"
SCHEMA = ROOT / "src" / "nvdp" / "config" / "config-schema.json"
NAMESPACE = "bench"
TEMPLATE_NODE = "bench-template"
START_TIMEOUT_S = 60.0
Obj = dict[str, Any]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Mode:
    profile: str
    mig_strategy: str
    device_class: str
    empty_mig: bool = False  # MIG mode on, no MIG device yet (dynamic MIG)


MODES = {
    "whole": Mode("a100-sxm-8", "none", "gpu.nvidia.com"),
    "static": Mode("h100-mig-8", "mixed", "mig.nvidia.com"),
    "dynamic": Mode("h100-mig-8", "dynamic", "mig.nvidia.com", empty_mig=True),
}


# -- nvdp's slices ---------------------------------------------------------------------------------------


def has_dynamic_profiles_key() -> bool:
    """Whether this nvdp's config has flags.migDynamicProfiles."""
    schema = json.loads(SCHEMA.read_text())
    return "migDynamicProfiles" in schema["properties"]["flags"]["properties"]


def mode_inventory(mode: Mode) -> Inventory:
    import yaml

    doc = yaml.safe_load((PROFILES / f"{mode.profile}.yaml").read_text())
    if mode.empty_mig:
        for gpu in doc["gpus"]:
            gpu.pop("mig_devices", None)
            gpu["mig_enabled"] = True
    return inventory_from_profile(doc)


def template_slices(mode: Mode, profiles: Sequence[str]) -> list[Obj]:
    """The slices nvdp publishes for one node of `mode`, for TEMPLATE_NODE."""
    flags: Obj = {"migStrategy": mode.mig_strategy}
    if profiles:
        flags["migDynamicProfiles"] = list(profiles)
    config = load_config_text(json.dumps({"version": "v1", "flags": flags}), "bench config", env={})
    devices = pool_devices(config, mode_inventory(mode))
    return desired_slices(node=TEMPLATE_NODE, node_uid="", driver=DEFAULT_DRIVER, devices=devices)


def retarget(template: Sequence[Obj], node: str, uid: str) -> list[Obj]:
    """The template's slices as node `node` (uid `uid`) publishes them."""
    out = []
    for index, tmpl in enumerate(template):
        obj = copy.deepcopy(tmpl)
        obj["metadata"] = {
            "name": slice_name(node, obj["spec"]["driver"], index),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
                                 "controller": True}],
        }
        obj["spec"]["nodeName"] = node
        obj["spec"]["pool"]["name"] = node
        out.append(obj)
    return out


def device_classes() -> list[Obj]:
    """The chart's DeviceClasses with DRA on, rendered by Helm's engine."""
    import helm_python
    import yaml

    chart = helm_python.Chart.load(str(CHART))
    rendered = chart.render({"dra": {"enabled": True}}, name="nvdp", namespace="nvidia-device-plugin",
                            is_install=True)
    text = rendered["nvidia-device-plugin/templates/deviceclasses.yaml"]
    return [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "DeviceClass"]


def count_devices(slices: Iterable[Obj]) -> tuple[int, int]:
    devices = sets = 0
    for s in slices:
        devices += len(s["spec"].get("devices") or [])
        sets += len(s["spec"].get("sharedCounters") or [])
    return devices, sets


# -- processes -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of process `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Cluster:
    """etcd + kube-apiserver + kube-scheduler under `workdir`."""

    workdir: Path
    scheduler_bin: Path
    qps: int
    burst: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pki = self.workdir / "pki"
        self.port = free_port()
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.scheduler_port = free_port()

    def start_control_plane(self) -> None:
        make_pki(self.pki)
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "bench", "cluster": {"server": f"https://127.0.0.1:{self.port}",
                                                       "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"client-certificate": str(self.pki / "admin.crt"),
                                                 "client-key": str(self.pki / "admin.key")}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "admin"}}],
            "current-context": "bench",
        }))
        etcd_port, peer_port = free_port(), free_port()
        client, peer = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            str(ASSETS / "etcd"), "--name", "bench", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bench={peer}", "--log-level", "warn",
            "--quota-backend-bytes", str(8 * 2**30)])
        self._wait("etcd", lambda: _http_ok(f"{client}/health", None))
        p = self.pki
        self._spawn("kube-apiserver", [
            str(ASSETS / "kube-apiserver"), f"--etcd-servers={client}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", f"--cert-dir={self.workdir / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC", "--v=0"])
        api = Api(self)
        self._wait("kube-apiserver", lambda: api.ok("/readyz"))
        self._wait("the default namespace", lambda: api.ok("/api/v1/namespaces/default"))

    def start_scheduler(self) -> None:
        config = self.workdir / "scheduler.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": self.qps, "burst": self.burst},
            "leaderElection": {"leaderElect": False},
        }))
        kc = str(self.kubeconfig)
        self._spawn("kube-scheduler", [
            str(self.scheduler_bin), f"--config={config}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}", "--v=1"])
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._wait("kube-scheduler", lambda: _http_ok(f"https://127.0.0.1:{self.scheduler_port}/healthz",
                                                     insecure))

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.kill()  # nothing to keep: the whole cluster is thrown away
            proc.wait(10)

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def _wait(self, name: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for proc_name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc_name} exited ({proc.returncode}):\n{self.log_tail(proc_name)}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} not ready after {START_TIMEOUT_S:.0f} s:\n{self.log_tail(name)}")


def _http_ok(url: str, context: ssl.SSLContext | None) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


# -- API client ------------------------------------------------------------------------------------------


class ApiError(RuntimeError):
    pass


class Api:
    """A small HTTPS client of the bench's API server as admin: one keep-alive connection per thread."""

    def __init__(self, cluster: Cluster) -> None:
        self.port = cluster.port
        self.context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        self.context.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
        self.local = threading.local()

    def connection(self, timeout: float | None = 60) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=timeout)

    def request(self, method: str, path: str, body: Obj | None = None,
                content_type: str = "application/json") -> Obj:
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        for attempt in range(3):
            conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = self.connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
                continue
            if (resp.status == 429 or resp.status >= 500) and attempt < 2:
                time.sleep(0.5)
                continue
            if resp.status >= 300:
                raise ApiError(f"{method} {path}: {resp.status} {payload[:400]!r}")
            result: Obj = json.loads(payload) if payload else {}
            return result
        raise ApiError(f"{method} {path}: no answer")

    def ok(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except (ApiError, OSError, http.client.HTTPException):
            return False
        except ValueError:  # /readyz answers "ok", not JSON
            return True
        return True


def in_parallel(fn: Callable[[T], R], items: Iterable[T], workers: int = 8) -> list[R]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


class BindingWatch:
    """Records when each pod of NAMESPACE is first seen with spec.nodeName set (list, then watch)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.bound: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.conn: http.client.HTTPSConnection | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        conn = self.conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)

    def count(self) -> int:
        with self.lock:
            return len(self.bound)

    def last(self) -> float:
        with self.lock:
            return max(self.bound.values(), default=0.0)

    def _see(self, pod: Obj, now: float) -> None:
        if pod.get("spec", {}).get("nodeName"):
            with self.lock:
                self.bound.setdefault(pod["metadata"]["name"], now)

    def _run(self) -> None:
        base = f"/api/v1/namespaces/{NAMESPACE}/pods"
        while not self.stopped.is_set():
            try:
                listed = self.api.request("GET", base)
                now = time.monotonic()
                for pod in listed.get("items", []):
                    self._see(pod, now)
                rv = listed["metadata"]["resourceVersion"]
                self.conn = conn = self.api.connection(timeout=None)
                conn.request("GET", f"{base}?watch=1&resourceVersion={rv}&timeoutSeconds=3600",
                             headers={"Accept": "application/json"})
                resp = conn.getresponse()
                while not self.stopped.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(event["object"], time.monotonic())
                conn.close()
            except (OSError, ValueError, ApiError, http.client.HTTPException):
                if not self.stopped.is_set():
                    time.sleep(0.2)


# -- objects ---------------------------------------------------------------------------------------------


def node_object(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "nvidia.com/gpu.present": "true"}}}


def node_status() -> Obj:
    resources = {"cpu": "128", "memory": "2Ti", "pods": "250"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake node of the scheduler bench", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}],
    }}


def claim_object(name: str, device_class: str, profile: str | None) -> Obj:
    request: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if profile:
        request["selectors"] = [{"cel": {"expression":
                                         f"device.attributes['{DEFAULT_DRIVER}'].profile == '{profile}'"}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}


def pod_object(name: str, claim: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}


# -- the run ---------------------------------------------------------------------------------------------


def unbound_reason(api: Api) -> str:
    """What the scheduler says about one pod it has not bound (its PodScheduled condition)."""
    for pod in api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods").get("items", []):
        if pod["spec"].get("nodeName"):
            continue
        for cond in pod.get("status", {}).get("conditions", []):
            if cond.get("type") == "PodScheduled":
                return f"{pod['metadata']['name']}: {cond.get('reason')}: {cond.get('message')}"
        return f"{pod['metadata']['name']}: no PodScheduled condition (not tried yet)"
    return ""


def scheduler_version(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return out.stdout.strip().removeprefix("Kubernetes ") or "unknown"


def wait_quiet(pid: int, limit_s: float = 30.0) -> None:
    """Until the process used under 10 ms of CPU in half a second (its informers have caught up)."""
    deadline = time.monotonic() + limit_s
    before = proc_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = proc_cpu_s(pid)
        if now - before < 0.01:
            return
        before = now


def run(args: argparse.Namespace) -> Obj:
    mode = MODES[args.mode]
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()] if args.profiles else []
    template = template_slices(mode, profiles)
    devices_per_node, sets_per_node = count_devices(template)
    classes = device_classes()
    claim_profile = None if mode.device_class == "gpu.nvidia.com" else args.claim_profile
    result: Obj = {
        "mode": args.mode, "profile": mode.profile, "migStrategy": mode.mig_strategy,
        "migDynamicProfiles": profiles or None, "nodes": args.nodes, "pods": args.pods,
        "devices_per_node": devices_per_node, "counter_sets_per_node": sets_per_node,
        "slices_per_node": len(template), "claim": f"{mode.device_class}"
                                                  + (f" profile {claim_profile}" if claim_profile else ""),
        "scheduler": str(args.scheduler), "scheduler_version": scheduler_version(args.scheduler),
        "qps": args.qps, "burst": args.burst, "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = Path(tempfile.mkdtemp(prefix="nvdp-scheduler-bench-", dir=base))
    cluster = Cluster(workdir, args.scheduler, args.qps, args.burst)
    watch: BindingWatch | None = None
    try:
        t = time.monotonic()
        cluster.start_control_plane()
        api = Api(cluster)
        result["control_plane_start_s"] = round(time.monotonic() - t, 1)

        t = time.monotonic()
        api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": NAMESPACE}})
        api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        for dc in classes:
            api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", dc)
        names = [f"node-{i:04d}" for i in range(args.nodes)]

        def make_node(name: str) -> str:
            uid = str(api.request("POST", "/api/v1/nodes", node_object(name))["metadata"]["uid"])
            api.request("PATCH", f"/api/v1/nodes/{name}/status", node_status(),
                        content_type="application/merge-patch+json")
            # The API server taints a new node not-ready (TaintNodesByCondition); the node lifecycle
            # controller, which does not run here, would lift it once the node is Ready.
            api.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
                        content_type="application/merge-patch+json")
            return uid

        uids = in_parallel(make_node, names)
        slice_bodies = [s for n, u in zip(names, uids, strict=True) for s in retarget(template, n, u)]
        result["slices_json_bytes"] = sum(len(json.dumps(s, separators=(",", ":"))) for s in slice_bodies)
        in_parallel(partial(api.request, "POST", "/apis/resource.k8s.io/v1/resourceslices"), slice_bodies)
        result["populate_s"] = round(time.monotonic() - t, 1)

        cluster.start_scheduler()
        sched = cluster.pid("kube-scheduler")
        wait_quiet(sched)
        watch = BindingWatch(api)
        watch.start()
        time.sleep(0.5)

        cpu0 = proc_cpu_s(sched)
        claims = [f"claim-{i:05d}" for i in range(args.pods)]
        claim_bodies = [claim_object(c, mode.device_class, claim_profile) for c in claims]
        pod_bodies = [pod_object(f"pod-{i:05d}", c) for i, c in enumerate(claims)]
        t_claims = time.monotonic()
        claims_path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        in_parallel(partial(api.request, "POST", claims_path), claim_bodies)
        t0 = time.monotonic()
        in_parallel(partial(api.request, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods"), pod_bodies)
        result["claims_create_s"] = round(t0 - t_claims, 2)
        result["pods_create_s"] = round(time.monotonic() - t0, 2)

        deadline = t0 + args.timeout
        while watch.count() < args.pods and time.monotonic() < deadline:
            if cluster.procs["kube-scheduler"].poll() is not None:
                raise RuntimeError(f"kube-scheduler exited:\n{cluster.log_tail('kube-scheduler')}")
            time.sleep(0.05)
        end = time.monotonic()
        cpu = proc_cpu_s(sched) - cpu0
        bound = watch.count()
        if bound < args.pods:
            result["unbound_reason"] = unbound_reason(api)
        listed = api.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
        result["claims_allocated"] = sum(1 for c in listed.get("items", [])
                                         if c.get("status", {}).get("allocation"))
        span = (watch.last() - t0) if bound == args.pods else (end - t0)
        result.update({
            "bound": bound, "timed_out": bound < args.pods, "wait_s": round(end - t0, 1),
            "pods_per_s": round(bound / span, 2) if bound and span > 0 else 0.0,
            "scheduler_cpu_s": round(cpu, 2),
            # below the machine's cores while pods wait: something else had the CPU
            "scheduler_cores_used": round(cpu / (end - t0), 2) if end > t0 else None,
            "scheduler_cpu_ms_per_pod": round(1000 * cpu / bound, 1) if bound else None,
            "scheduler_rss_peak_mib": round(vm_hwm_mib(sched)),
            "apiserver_rss_peak_mib": round(vm_hwm_mib(cluster.pid("kube-apiserver"))),
        })
        return result
    finally:
        if watch is not None:
            watch.stop()
        cluster.stop()
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def table_row(r: Obj) -> str:
    mib = r["slices_json_bytes"] / 2**20
    size = f"{mib:.1f} MiB" if mib >= 0.1 else f"{r['slices_json_bytes'] / 1024:.0f} KiB"
    scenario = r["mode"] + (f" ({','.join(r['migDynamicProfiles'])})" if r["migDynamicProfiles"] else "")
    bound = f"{r['bound']}/{r['pods']}" + (" (timeout)" if r["timed_out"] else "")
    cpu = r["scheduler_cpu_ms_per_pod"]
    return (f"| {scenario} | {r['nodes']} | {r['devices_per_node']} | {size} | {bound} | {r['pods_per_s']} | "
            f"{cpu if cpu is not None else '-'} | {r['scheduler_rss_peak_mib']} MiB | "
            f"{r['apiserver_rss_peak_mib']} MiB |")


TABLE_HEADER = ("| scenario | nodes | devices/node | slices JSON | bound | pods/s | scheduler CPU ms/pod | "
                "scheduler RSS peak | apiserver RSS peak |\n|---|---|---|---|---|---|---|---|---|")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), default="dynamic",
                        help="whole GPUs, static MIG (mixed) or dynamic MIG (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=50, help="fake nodes (default %(default)s)")
    parser.add_argument("--pods", type=int, default=100, help="claims and pods (default %(default)s)")
    parser.add_argument("--scheduler", type=Path, default=K8S_DIR / "bin" / "kube-scheduler",
                        help="the kube-scheduler binary (default %(default)s)")
    parser.add_argument("--profiles", metavar="LIST",
                        help="dynamic mode: the MIG profiles offered (flags.migDynamicProfiles), e.g. "
                             "1g.10gb,3g.40gb")
    parser.add_argument("--claim-profile", default="1g.10gb",
                        help="MIG modes: the profile each claim asks for; empty: any MIG device "
                             "(default %(default)s)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait for bindings before reporting what there is "
                             "(default %(default)s)")
    parser.add_argument("--qps", type=int, default=500,
                        help="kube-scheduler client QPS (default %(default)s)")
    parser.add_argument("--burst", type=int, default=1000,
                        help="kube-scheduler client burst (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.pods < 1:
        parser.error("--nodes and --pods must be at least 1")
    if args.profiles:
        if args.mode != "dynamic":
            parser.error("--profiles applies to --mode dynamic")
        if not has_dynamic_profiles_key():
            parser.error("this nvdp's config has no flags.migDynamicProfiles "
                         "(see src/nvdp/config/config-schema.json)")
    missing = [str(p) for p in (ASSETS / "etcd", ASSETS / "kube-apiserver", args.scheduler)
               if not os.access(p, os.X_OK)]
    if missing:
        print(f"scheduler_bench: missing or not executable: {', '.join(missing)}; run the k8s kit's setup.sh "
              "as root, or set KUBEBUILDER_ASSETS / --scheduler", file=sys.stderr)
        return 2
    result = run(args)
    print(json.dumps(result))
    print(TABLE_HEADER)
    print(table_row(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
