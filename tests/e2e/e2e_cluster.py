"""A real cluster for end-to-end scenarios: bring it up and down, load the images, run helm and kubectl, wait.

Two backends share one interface, so every scenario runs on both:

- `KitCluster`: the k8s kit's single node on this machine (`<repo>/../shared/k8s`: setup.sh, node-up.sh,
  down.sh, helm.py), images built without a container engine (scripts/kit_images.py). Needs root. The
  node exists once per machine, so `node_lock()` serialises every user of it.
- `KindCluster`: a kind cluster on a machine with Docker (tests/e2e/run.sh), images from the Dockerfiles.

Scenarios only use the methods of `Cluster`: `helm`, `kubectl`, `wait_for`, `allocatable`, `host`
(a shell on the node, for the stand-in NVML's state and the MPS root), `restart_kubelet`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import kit_images  # noqa: E402

CHART = ROOT / "charts" / "nvidia-device-plugin"
NODE_LOCK = Path("/tmp/nvdp-kit-node.lock")
GPU = "nvidia.com/gpu"
# The stand-in NVML's node-wide state, below the chart's default mps.root (the images set
# NVML_SIM_STATE_DIR=/mps/gpu.nvidia.com/nvml-sim: the device plugin and the MPS daemon mount mps.root at
# /mps where MPS is in use, the DRA plugin and its dra-mps daemons <mps.root>/gpu.nvidia.com).
MPS_ROOT = "/run/nvidia/mps"
SIM_STATE_DIR = f"{MPS_ROOT}/gpu.nvidia.com/nvml-sim"
# The device plugin mounts mps.root only where MPS is in use; a story that injects faults through the
# stand-in's node-wide state without MPS gives it the mount with mps.enabled (the MPS daemon itself is
# not scheduled: the node carries no nvidia.com/mps.capable=true).
SIM_STATE_MOUNT = ("--set", "mps.enabled=true")
# The chart's devicePlugin.healthRecovery.stateDir: the health record outlives a release on purpose
# (a reinstall does not bring back a GPU waiting for a reset), so each scenario starts without one.
HEALTH_DIR = "/run/nvidia/nvdp"
# The stand-in NVML's per-GPU health conditions (sim/nvml/README.md).
SIM_HEALTH_FILES = ("lost", "unanswering", "retired-pending", "remap-pending", "remap-failed", "ecc-volatile",
                    "ecc-aggregate", "recovery-action")
T = TypeVar("T")


class ClusterUnavailable(RuntimeError):
    """The cluster could not be brought up: the suite skips, loudly (infrastructure, not product)."""


def stand_in_base(ref: str) -> tuple[str, str]:
    """The repository and tag a user sets for the stand-in image `<repository>-sim:<tag>`, the name the
    chart's unsupported.simulatedGpus runs."""
    repository, tag = ref.rsplit(":", 1)
    suffix = kit_images.STAND_IN_SUFFIX
    assert repository.endswith(suffix), f"{ref}: not named as the chart expects a stand-in image"
    return repository.removesuffix(suffix), tag


@dataclass(frozen=True)
class Images:
    """The one set of stand-in images (every node profile in each) and the profile a release selects."""

    plugin: str  # full references, e.g. docker.io/local/nvdp-plugin-sim:0.1.0-abc
    mps_daemon: str
    profile: str  # sim/profiles/<profile>.yaml, what the chart's unsupported.simulatedGpus names
    # docker-archive of each image by name ("plugin", "mps-daemon"), where the backend keeps one
    archives: dict[str, Path] = field(default_factory=dict)

    def with_profile(self, profile: str) -> Images:
        """The same images showing another node profile: nothing is built."""
        return dataclasses.replace(self, profile=profile)

    def helm_args(self) -> list[str]:
        """Values that run the chart (and its `helm test` pod) from these local images with the profile,
        as a user of unsupported.simulatedGpus types them: the project's repositories, tags and the
        profile; the chart adds `-sim` and the profile's environment."""
        plugin_repo, plugin_tag = stand_in_base(self.plugin)
        mps_repo, mps_tag = stand_in_base(self.mps_daemon)
        return [
            "--set", f"image.repository={plugin_repo}", "--set-string", f"image.tag={plugin_tag}",
            "--set", "image.pullPolicy=Never",
            "--set", f"mpsImage.repository={mps_repo}", "--set-string", f"mpsImage.tag={mps_tag}",
            "--set", f"unsupported.simulatedGpus={self.profile}",
            "--set", "tests.image.pullPolicy=Never",
        ]  # fmt: skip


@dataclass
class Timings:
    """Seconds per (scenario, step); printed as a table at the end, never asserted."""

    rows: list[tuple[str, str, float]] = field(default_factory=list)

    def add(self, scenario: str, step: str, seconds: float) -> None:
        self.rows.append((scenario, step, seconds))

    @contextlib.contextmanager
    def measure(self, scenario: str, step: str) -> Iterator[None]:
        start = time.monotonic()
        yield
        self.add(scenario, step, time.monotonic() - start)

    def table(self) -> str:
        lines = ["| scenario | step | seconds |", "|---|---|---|"]
        lines += [f"| {scenario} | {step} | {seconds:.1f} |" for scenario, step, seconds in self.rows]
        return "\n".join(lines)


@contextlib.contextmanager
def node_lock(timeout_s: float) -> Iterator[None]:
    """The kit's node is one per machine: hold its lock (the same file `flock` uses) for the whole run."""
    with open(NODE_LOCK, "a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ClusterUnavailable(
                        f"another user held {NODE_LOCK} for more than {timeout_s:.0f} s"
                    ) from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Cluster:
    """What scenarios need from a cluster; the backends below fill in the commands."""

    node: str = ""

    # --- backend specifics
    def setup(self) -> None:
        """Install what the backend needs (idempotent)."""
        raise NotImplementedError

    def up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def build_images(self, profile: str) -> Images:
        """Build (or reuse) the stand-in images, which carry every node profile, and make them available
        to the node; releases with them show `profile` (Images.with_profile: another one, same images)."""
        raise NotImplementedError

    def kubectl_argv(self) -> list[str]:
        raise NotImplementedError

    def helm_argv(self) -> list[str]:
        raise NotImplementedError

    def host_argv(self, script: str) -> list[str]:
        raise NotImplementedError

    def restart_kubelet(self) -> None:
        raise NotImplementedError

    def kubelet_log_mark(self) -> str:
        """Where the kubelet's log is now: `kubelet_log_since` gives what it wrote after."""
        raise NotImplementedError

    def kubelet_log_since(self, mark: str) -> str:
        raise NotImplementedError

    def runtime_log_mark(self) -> str | None:
        """Where the container runtime's debug log is now; None where this backend cannot read one."""
        return None

    def runtime_log_since(self, mark: str) -> str:
        """What the runtime logged after `mark` (e.g. containerd's "CDI devices from ..." lines)."""
        raise NotImplementedError

    # --- shared
    def _run(
        self, argv: Sequence[str], check: bool, timeout: float, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(
                f"`{shlex.join(argv)}` failed (exit {done.returncode}):\n"
                f"{done.stderr[-3000:]}{done.stdout[-1500:]}"
            )
        return done

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self._run([*self.kubectl_argv(), *args], check, timeout, stdin)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]]) -> None:
        items = manifest if isinstance(manifest, list) else [manifest]
        self.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self._run([*self.helm_argv(), *args], check, timeout)

    def host(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A shell command on the node itself (not in a pod)."""
        return self._run(self.host_argv(script), check, 60)

    def node_object(self) -> Any:
        return self.kubectl_json("get", "node", self.node)

    def allocatable(self, resource: str = GPU) -> int | None:
        value = self.node_object()["status"].get("allocatable", {}).get(resource)
        return None if value is None else int(value)

    def remove_namespaces(self, *names: str, timeout: float = 120) -> None:
        """Delete the namespaces of a story's workloads and wait for them to go; pods are removed at
        once first. A namespace still there after `timeout` is reported, never raised: the release's
        uninstall after it must run whatever happens, or its cluster-wide objects (DeviceClasses)
        block every later story's install."""
        for name in names:
            self.kubectl("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", "--wait=false",
                         check=False)
        for name in names:
            try:
                self.kubectl("delete", "namespace", name, "--wait=true", check=False, timeout=timeout)
            except subprocess.TimeoutExpired:
                left = self.kubectl("get", "all,resourceclaims", "-n", name, "-o", "name", check=False)
                print(f"namespace {name} still terminating after {timeout:.0f} s: {left.stdout.split()}")

    def label(self, labels: dict[str, str | None]) -> None:
        """Set (a value) or remove (None) labels of the node."""
        args = [f"{k}-" if v is None else f"{k}={v}" for k, v in labels.items()]
        self.kubectl("label", "node", self.node, "--overwrite", *args)

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 90, every: float = 0.5,
                 diagnose: Callable[[], str] | None = None) -> tuple[T, float]:  # fmt: skip
        """Polls `probe` until it returns other than None/False; returns that and the seconds taken."""
        start = time.monotonic()
        last: T | None = None
        while True:
            last = probe()
            if last is not None and last is not False:
                return last, time.monotonic() - start
            if time.monotonic() - start > timeout:
                detail = diagnose() if diagnose else ""
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n{detail}"
                )
            time.sleep(every)

    def wait_allocatable(self, count: int, timeout: float = 90, namespace: str | None = None) -> float:
        def probe() -> bool:
            return self.allocatable() == count

        def diagnose() -> str:
            return f"allocatable {GPU}: {self.allocatable()}\n" + (self.logs(namespace) if namespace else "")

        return self.wait_for(f"allocatable {GPU} = {count}", probe, timeout, diagnose=diagnose)[1]

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", "pods", "-n", namespace] + (["-l", selector] if selector else [])
        items: list[dict[str, Any]] = self.kubectl_json(*args)["items"]
        return items

    def logs(self, namespace: str, selector: str = "app.kubernetes.io/name=nvidia-device-plugin",
             tail: int = 60) -> str:  # fmt: skip
        """The recent log of every container of matching pods, for failure messages and log checks."""
        out = []
        for pod in self.pods(namespace, selector):
            name = pod["metadata"]["name"]
            for container in pod["spec"]["containers"]:
                done = self.kubectl("logs", "-n", namespace, name, "-c", container["name"], f"--tail={tail}",
                                    check=False)  # fmt: skip
                out.append(f"--- {name}/{container['name']}\n{done.stdout}{done.stderr}")
        return "\n".join(out)

    def refresh_config_volumes(self, namespace: str, selector: str) -> None:
        """Have the kubelet sync the pods now, which refreshes their ConfigMap volumes: by itself it does
        so at its next periodic sync (up to its syncFrequency, 1 min, after the change), a wait of the
        kubelet's, not of the software under test. An annotation change is a pod update, which the
        kubelet syncs at once."""
        self.kubectl("annotate", "pods", "-n", namespace, "-l", selector, "--overwrite",
                     f"nvdp-e2e/config-refresh={time.time_ns()}")

    def exec(self, namespace: str, pod: str, *argv: str) -> str:
        return self.kubectl("exec", "-n", namespace, pod, "--", *argv).stdout

    def inject_xid(self, uuid: str, xid: int) -> None:
        """An XID event on the stand-in NVML of the node, as the driver would report it."""
        self.host(f"mkdir -p {SIM_STATE_DIR} && echo '{uuid} {xid}' >> {SIM_STATE_DIR}/events")

    def sim_gpu_state(self, kind: str, uuid: str, value: str | None) -> None:
        """Set (a value) or remove (None) one of the stand-in NVML's per-GPU conditions, as the
        sim.nvml helpers do (e.g. "ecc-volatile" with "1"; removing "lost" finds the GPU again)."""
        path = f"{SIM_STATE_DIR}/{kind}/{uuid}"
        if value is None:
            self.host(f"rm -f {path}")
        else:
            self.host(f"mkdir -p {SIM_STATE_DIR}/{kind} && echo {value} > {path}.tmp && mv {path}.tmp {path}")

    def forget_health(self) -> None:
        """No health record and no stand-in GPU faults left from an earlier scenario."""
        faults = " ".join(f"{SIM_STATE_DIR}/{kind}" for kind in SIM_HEALTH_FILES)
        self.host(f"rm -rf {HEALTH_DIR} {faults}")


class KitCluster(Cluster):
    """The k8s kit's full node on this machine (root; the kit at `<repo>/../shared/k8s`)."""

    def __init__(self, kit: Path, k8s_dir: Path) -> None:
        self.kit = kit
        self.k8s_dir = k8s_dir
        self.env = {**os.environ, "K8S_DIR": str(k8s_dir), "KUBECONFIG": str(k8s_dir / "admin.kubeconfig")}

    @staticmethod
    def find_kit() -> Path | None:
        configured = os.environ.get("NVDP_K8S_KIT")
        kit = Path(configured) if configured else ROOT.parent / "shared" / "k8s"
        return kit if (kit / "node-up.sh").exists() else None

    def script(self, name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
        argv = ["bash", str(self.kit / name), *args]
        done = subprocess.run(argv, capture_output=True, text=True, env={**self.env, **(env or {})},
                              timeout=timeout, check=False)  # fmt: skip
        if done.returncode != 0:
            raise ClusterUnavailable(
                f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}{done.stdout[-2000:]}"
            )
        return done.stdout

    def setup(self) -> None:
        self.script("setup.sh")

    def up(self) -> None:
        # FRESH: whatever someone else left in etcd (fake nodes, releases) is not ours to trust.
        self.script("node-up.sh", env={"FRESH": "1"})
        self.node = (self.k8s_dir / "node-name").read_text().strip()

    def down(self) -> None:
        self.script("down.sh")

    def kubectl_argv(self) -> list[str]:
        return [
            str(self.k8s_dir / "venv/bin/kubectl"),
            "--kubeconfig",
            str(self.k8s_dir / "admin.kubeconfig"),
        ]

    def helm_argv(self) -> list[str]:
        return [str(self.k8s_dir / "venv/bin/python"), str(self.kit / "helm.py"),
                "--kubeconfig", str(self.k8s_dir / "admin.kubeconfig")]  # fmt: skip

    def host_argv(self, script: str) -> list[str]:
        return ["bash", "-c", script]

    def build_images(self, profile: str) -> Images:
        os.environ.setdefault("K8S_DIR", str(self.k8s_dir))
        try:
            built = kit_images.build_images(self.kit, stand_ins=True, log=False)
        except kit_images.BuildError as err:
            raise AssertionError(f"building the images failed: {err}") from err
        return Images(
            plugin=built["plugin"].ref,
            mps_daemon=built["mps-daemon"].ref,
            profile=profile,
            archives={name: image.archive for name, image in built.items()},
        )

    def kubelet_log_mark(self) -> str:
        return str((self.k8s_dir / "logs" / "kubelet.log").stat().st_size)

    def kubelet_log_since(self, mark: str) -> str:
        with open(self.k8s_dir / "logs" / "kubelet.log", "rb") as log:
            log.seek(int(mark))
            return log.read().decode(errors="replace")

    def runtime_log_mark(self) -> str | None:
        return str((self.k8s_dir / "logs" / "containerd.log").stat().st_size)

    def runtime_log_since(self, mark: str) -> str:
        with open(self.k8s_dir / "logs" / "containerd.log", "rb") as log:
            log.seek(int(mark))
            return log.read().decode(errors="replace")

    def restart_kubelet(self) -> None:
        """Stop the kubelet (its pid as the kit recorded it) and start it again through node-up.sh."""
        pid_file = self.k8s_dir / "run" / "kubelet.pid"
        pid = int(pid_file.read_text())
        os.kill(pid, 15)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.script("node-up.sh")


class KindCluster(Cluster):
    """A kind cluster (Docker); images built with docker from images/ and tests/e2e/Dockerfile.sim."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.node = f"{name}-control-plane"

    def kubectl_argv(self) -> list[str]:
        return ["kubectl", "--context", f"kind-{self.name}"]

    def helm_argv(self) -> list[str]:
        return ["helm", "--kube-context", f"kind-{self.name}"]

    def host_argv(self, script: str) -> list[str]:
        return ["docker", "exec", self.node, "sh", "-c", script]

    def restart_kubelet(self) -> None:
        self.host("systemctl restart kubelet")

    def kubelet_log_mark(self) -> str:
        return self.host("date +%s").stdout.strip()

    def kubelet_log_since(self, mark: str) -> str:
        return self.host(f"journalctl -u kubelet --since @{int(mark) - 1} -o cat --no-pager").stdout

    def setup(self) -> None:
        return None

    def up(self) -> None:
        clusters = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True, check=False)
        if self.name not in clusters.stdout.split():
            self._run(["kind", "create", "cluster", "--name", self.name, "--wait", "120s"], True, 300)

    def down(self) -> None:
        if not os.environ.get("KEEP_CLUSTER"):
            self._run(["kind", "delete", "cluster", "--name", self.name], False, 120)

    def build_images(self, profile: str) -> Images:
        tag = "e2e"
        refs = {}
        for name in ("plugin", "mps-daemon"):
            base = f"nvdp-{name}:{tag}"
            ref = f"nvdp-{name}{kit_images.STAND_IN_SUFFIX}:{tag}"
            self._run(["docker", "build", "-q", "-f", str(ROOT / "images" / name / "Dockerfile"), "-t", base,
                       str(ROOT)], True, 900)  # fmt: skip
            self._run(["docker", "build", "-q", "-f", str(ROOT / "tests/e2e/Dockerfile.sim"),
                       "--build-arg", f"BASE_IMAGE={base}", "-t", ref, str(ROOT)], True, 900)  # fmt: skip
            self._run(["kind", "load", "docker-image", "--name", self.name, ref], True, 300)
            refs[name] = f"docker.io/library/{ref}"
        return Images(plugin=refs["plugin"], mps_daemon=refs["mps-daemon"], profile=profile)


DATA = Path(__file__).resolve().parent / "data"


@dataclass
class Release:
    """One helm release of the chart, installed as a user types it, with the suite's images."""

    cluster: Cluster
    images: Images
    name: str
    namespace: str

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name}"

    def _values(self, args: Sequence[str]) -> list[str]:
        return [
            "-n",
            self.namespace,
            "-f",
            str(DATA / "values-stand-ins.yaml"),
            *self.images.helm_args(),
            *args,
        ]

    def install(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        self.cluster.forget_health()
        return self.cluster.helm("install", self.name, str(CHART), "--create-namespace", *self._values(args),
                                 "--wait", "--timeout", "180s", check=check)  # fmt: skip

    def upgrade(self, *args: str, wait: bool = True) -> subprocess.CompletedProcess[str]:
        waiting = ["--wait", "--timeout", "180s"] if wait else []
        return self.cluster.helm("upgrade", self.name, str(CHART), *self._values(args), *waiting)

    def uninstall(self) -> None:
        done = self.cluster.helm("uninstall", self.name, "-n", self.namespace, "--wait", check=False)
        if done.returncode != 0:  # shown with the story's output: what a later install may trip on
            print(f"helm uninstall {self.name} failed (exit {done.returncode}): {done.stderr[-1500:]}")
        self.cluster.forget_health()

    def pods(self, component: str = "") -> list[dict[str, Any]]:
        selector = self.selector + (f",app.kubernetes.io/component={component}" if component else "")
        return self.cluster.pods(self.namespace, selector)

    def daemonsets(self) -> list[str]:
        items = self.cluster.kubectl_json("get", "daemonsets", "-n", self.namespace, "-l", self.selector)[
            "items"
        ]
        return sorted(item["metadata"]["name"] for item in items)

    def logs(self, component: str = "device-plugin") -> str:
        return self.cluster.logs(self.namespace, f"{self.selector},app.kubernetes.io/component={component}")

    def wait_ready(self, component: str = "device-plugin", timeout: float = 60) -> float:
        """Until every pod of `component` is Ready (its readiness probe passed); the seconds taken."""

        def ready() -> bool:
            pods = self.pods(component)
            conditions = [pod["status"].get("conditions") or [] for pod in pods]
            return bool(pods) and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in each) for each in conditions
            )

        def diagnose() -> str:
            return "\n".join(str(pod["status"]) for pod in self.pods(component))

        return self.cluster.wait_for(f"the {component} pods Ready", ready, timeout, diagnose=diagnose)[1]


def gpu_pod(name: str, image: str, gpus: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A workload pod asking for `gpus` nvidia.com/gpu that just sleeps (exec into it to look around)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"nvdp-e2e": "workload", **(labels or {})}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "cuda",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sleep", "infinity"],
                "resources": {"limits": {GPU: str(gpus)}},
            }],
        },
    }  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """The Node's nvidia.com/gpu as the API server answered at one moment."""

    at: float  # time.monotonic() when the answer came
    allocatable: int | None
    capacity: int | None


def _count(resources: dict[str, str] | None) -> int | None:
    value = (resources or {}).get(GPU)
    return None if value is None else int(value)


class NodePoller:
    """Reads the Node through the API every `every` seconds on a background thread, keeping each sample.

    The GETs go through `kubectl proxy` (so either backend's credentials work), one at a time: a GET
    that takes longer than `every` is followed by the next at once. A failed GET is counted in
    `errors`, with the last message in `last_error`, and gives no sample.
    """

    def __init__(self, cluster: Cluster, every: float = 0.2) -> None:
        self.cluster, self.every = cluster, every
        self.samples: list[Sample] = []
        self.errors = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proxy: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._url = ""
        # Straight to the local proxy, whatever http_proxy says.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __enter__(self) -> NodePoller:
        self._proxy = subprocess.Popen([*self.cluster.kubectl_argv(), "proxy", "--port=0"], text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        assert self._proxy.stdout is not None
        line = self._proxy.stdout.readline()  # "Starting to serve on 127.0.0.1:PORT"
        if not line.startswith("Starting to serve on "):
            self._proxy.kill()
            self._proxy.wait()
            raise AssertionError(f"kubectl proxy did not start: {line!r}")
        self._url = f"http://{line.split()[-1]}/api/v1/nodes/{self.cluster.node}"
        self._thread = threading.Thread(target=self._loop, name="node poller", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._proxy is not None:
            self._proxy.terminate()
            self._proxy.wait(10)

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                with self._opener.open(self._url, timeout=5) as answer:
                    status = json.load(answer)["status"]
                sample = Sample(time.monotonic(), _count(status.get("allocatable")),
                                _count(status.get("capacity")))  # fmt: skip
                with self._lock:
                    self.samples.append(sample)
            except (OSError, ValueError, KeyError) as err:
                self.errors += 1
                self.last_error = repr(err)
            due = max(due + self.every, time.monotonic())
            self._stop.wait(due - time.monotonic())

    def since(self, start: float) -> list[Sample]:
        with self._lock:
            return [sample for sample in self.samples if sample.at >= start]

    def latest(self) -> Sample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None


@dataclass(frozen=True)
class Window:
    """The samples of one stretch of time (e.g. one config switch) and the counts allowed in it."""

    name: str
    start: float
    samples: list[Sample]
    allowed: frozenset[int]

    @property
    def allocatable(self) -> list[int | None]:
        return [sample.allocatable for sample in self.samples]

    def runs(self) -> list[tuple[int | None, int, float, float]]:
        """(value, samples, from, to) per run of equal allocatable counts; seconds since `start`; `to`
        is when the next run's first sample came (the end of the window for the last run)."""
        out: list[tuple[int | None, int, float, float]] = []
        for sample in self.samples:
            at = sample.at - self.start
            if out and out[-1][0] == sample.allocatable:
                value, n, begin, _ = out[-1]
                out[-1] = (value, n + 1, begin, at)
            else:
                if out:
                    value, n, begin, _ = out[-1]
                    out[-1] = (value, n, begin, at)
                out.append((sample.allocatable, 1, at, at))
        return out

    def drops(self) -> list[tuple[int | None, int, float, float]]:
        """The runs whose count is not allowed: (value, samples, from, to)."""
        return [run for run in self.runs() if run[0] not in self.allowed]

    def describe(self) -> str:
        known = [value for value in self.allocatable if value is not None]
        low, high = (min(known), max(known)) if known else (None, None)
        span = self.samples[-1].at - self.samples[0].at if self.samples else 0.0
        capacity = sorted({sample.capacity for sample in self.samples}, key=str)
        runs = ", ".join(f"{v} x{n} ({a:.1f}-{b:.1f} s)" for v, n, a, b in self.runs())
        return (f"{self.name}: {len(self.samples)} samples in {span:.1f} s, allocatable min {low} "
                f"max {high}, capacity {capacity}; runs: {runs}")  # fmt: skip


# A klog line: severity, MMDD, wall-clock time, thread, file:line] "message" key=value ...
_KLOG = re.compile(r'^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+)\s+\d+ \S+\] "([^"]*)"(.*)$')
_FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')


@dataclass(frozen=True)
class KubeletLine:
    at: float  # seconds since midnight, the kubelet's clock
    message: str
    fields: dict[str, str]


def device_plugin_lines(log: str, resource: str = GPU) -> list[KubeletLine]:
    """The kubelet's log lines about the device plugin of `resource` (its device manager's, at --v=2)."""
    out: list[KubeletLine] = []
    for line in log.splitlines():
        match = _KLOG.match(line)
        if match is None:
            continue
        hours, minutes, seconds, message, rest = match.groups()
        fields = {key: value.strip('"') for key, value in _FIELD.findall(rest)}
        if resource in (fields.get("resource"), fields.get("resourceName"), fields.get("name"),
                        fields.get("plugin")):  # fmt: skip
            at = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
            if out and at < out[-1].at:  # past midnight
                at += 86400
            out.append(KubeletLine(at, message, fields))
    return out


@dataclass(frozen=True)
class KubeletView:
    """What the kubelet's device manager did with one resource in a stretch of its log."""

    lines: list[KubeletLine]

    @property
    def streams_ended(self) -> int:
        """How often the kubelet saw the plugin's ListAndWatch stream end (the plugin endpoint gone)."""
        return sum(line.message.startswith("ListAndWatch ended") for line in self.lines)

    @property
    def registrations(self) -> int:
        return sum(line.message.startswith("Got registration request") for line in self.lines)

    def healthy(self) -> list[tuple[float, int]]:
        """(time, healthy devices) each time the device manager's count changed: a disconnected plugin's
        devices are all marked Unhealthy (0), each list from the plugin sets the count it says."""
        out: list[tuple[float, int]] = []
        for line in self.lines:
            if line.message.startswith("Mark all resources Unhealthy"):
                count = 0
            elif line.message.startswith("Processed device updates") and "healthyCount" in line.fields:
                count = int(line.fields["healthyCount"])
            else:
                continue
            if not out or out[-1][1] != count:
                out.append((line.at, count))
        return out

    def without(self, allowed: frozenset[int]) -> list[tuple[int, float]]:
        """(count, seconds) of each stretch the kubelet held a healthy count not in `allowed` (inf: until
        the end of the log)."""
        out: list[tuple[int, float]] = []
        changes = self.healthy()
        for (at, count), (until, _) in itertools.pairwise(changes):
            if count not in allowed:
                out.append((count, until - at))
        if changes and changes[-1][1] not in allowed:
            out.append((changes[-1][1], float("inf")))
        return out

    def describe(self, allowed: frozenset[int]) -> str:
        gaps = ", ".join(f"{count} for {seconds * 1000:.0f} ms" for count, seconds in self.without(allowed))
        return (f"kubelet: stream ended {self.streams_ended}x, registrations {self.registrations}, "
                f"healthy counts {[count for _, count in self.healthy()]}, outside {sorted(allowed)}: "
                f"{gaps or 'never'}")  # fmt: skip


@contextlib.contextmanager
def story_release(
    cluster: Cluster, images: Images, name: str, namespace: str, *, work: Sequence[str],
    labels: dict[str, str | None] | None = None, remove_timeout: float = 120,
) -> Iterator[Release]:
    """A story's Release (installed by its first step) on the node labelled GPU-present (and `labels`),
    its workloads' namespaces `work` made. On exit: those namespaces go first, then the release and its
    pods, the node's labels and the release's namespace. The workloads never share the release's
    namespace: deleting that drops helm's record of the release, and its uninstall would then leave
    the DeviceClasses that every later story's install trips on."""
    assert namespace not in work, f"{namespace}: a story's workloads need a namespace of their own"
    node_labels: dict[str, str | None] = {"nvidia.com/gpu.present": "true", **(labels or {})}
    cluster.label(node_labels)
    for each in work:
        cluster.kubectl("create", "namespace", each, check=False)
    release = Release(cluster, images, name, namespace)
    yield release
    cluster.remove_namespaces(*work, timeout=remove_timeout)
    release.uninstall()
    try:
        cluster.wait_for("the release's pods to go", lambda: not release.pods(), 90)
    finally:
        cluster.label(dict.fromkeys(node_labels))
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)
