"""The checks of `nvdp doctor`, in the order a broken GPU node is usually fixed.

Each check reads one thing (NVML, sysfs, /dev, the kubelet's directory, the config, the MPS root,
/proc) and says what it found; a failure carries the fix a user would otherwise have to dig out of
issue trackers: the driver not injected by the container runtime (`could not load NVML library`),
a kubelet socket elsewhere (k3s) or a kubelet without device plugins (Kubernetes < 1.10), a DaemonSet
not scheduled on the node, the MPS label, a `/dev/shm` not shared with the MPS daemon, MIG monitoring
without SYS_ADMIN. A check whose input failed earlier is SKIPped with that reason.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from msgspec import Struct, field

from nvdp.config.model import Config
from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

Context = Literal["container", "host"]
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
CAP_SYS_ADMIN = 21
CHECKPOINT = "kubelet_internal_checkpoint"
FIX_RUNTIME = (
    "run the plugin with the NVIDIA container runtime: chart value runtimeClassName: nvidia, or make "
    "nvidia the default runtime (containerd: `nvidia-ctk runtime configure --runtime=containerd "
    '--set-as-default`; docker: "default-runtime": "nvidia" in /etc/docker/daemon.json), restart the '
    "runtime, then delete the plugin pod so it is recreated"
)
FIX_SCHEDULING = (
    "check that the plugin pod runs on this node: `kubectl -n <namespace> get pods -o wide "
    "--field-selector spec.nodeName=<node>`; if the DaemonSet has no pod here, its nodeSelector or "
    "affinity does not match the node's labels (the chart's default wants nvidia.com/gpu.present=true "
    "or the NFD PCI label: `kubectl label node <node> nvidia.com/gpu.present=true`)"
)


class Where(Struct):
    """Where the doctor looks; tests point these at prepared directories."""

    env: Mapping[str, str]
    context: Context
    sysfs: Path = Path("/sys")
    proc: Path = Path("/proc")
    etc: Path = Path("/etc")
    shm: Path = Path("/dev/shm")
    node_name: str = ""
    # Node labels from the API when it can be reached (None: no API access).
    node_labels: Callable[[], Mapping[str, str] | None] = field(default=lambda: None)


def detect_context(env: Mapping[str, str]) -> Context:
    inside = (
        "KUBERNETES_SERVICE_HOST" in env
        or Path("/.dockerenv").exists()
        or Path("/run/.containerenv").exists()
    )
    return "container" if inside else "host"


def _split_fix(message: str) -> tuple[str, str]:
    head, sep, fix = message.partition(" Fix: ")
    return (head, fix) if sep else (message, "")


def _pci_bus(bus_id: str) -> str:
    """NVML's 00000000:3B:00.0 and sysfs's 0000:3b:00.0 as one form."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class Doctor:
    def __init__(
        self, where: Where, config: Config | None, config_error: str | None, entry: str = ""
    ) -> None:
        self.where = where
        self.entry = entry  # per-node config: which entry and why
        self.config = config or Config()
        self.config_valid = config is not None
        self.config_error = config_error
        self.inventory: Inventory | None = None
        self.nvml_error: str | None = None
        self.plan: Plan | None = None

    def run(self) -> list[Finding]:
        findings = [self.nvml(), self.driver(), self.gpus(), self.runtime(), self.kubelet()]
        self.plan = self._plan()
        findings += [self.registration(), self.config_check(), *self.mps(), self.mig()]
        return findings

    # --- 1-4: the driver ------------------------------------------------------------------------

    def nvml(self) -> Finding:
        from nvdp.inventory.library import find_library
        from nvdp.inventory.nvml import NvmlUnavailable, discover

        title = "NVML loads"
        flags = self.config.flags
        try:
            self.inventory = discover(flags.nvidia_driver_root, flags.plugin.container_driver_root)
        except NvmlUnavailable as err:
            self.nvml_error = str(err)
            detail, fix = _split_fix(str(err))
            return failed("nvml", title, detail, fix or FIX_RUNTIME)
        loaded = self._loaded_library() or "libnvidia-ml.so.1"
        under_root = find_library(flags.plugin.container_driver_root) is not None
        origin = (
            f"found under the driver root mounted at {flags.plugin.container_driver_root}"
            if under_root
            else "found on the library search path (injected by the container runtime or installed)"
        )
        return passed("nvml", title, f"{loaded}, {origin}")

    def _loaded_library(self) -> str | None:
        maps = _read(self.where.proc / "self" / "maps") or ""
        for line in maps.splitlines():
            if "libnvidia-ml.so" in line:
                return line.split(maxsplit=5)[-1]
        return None

    def driver(self) -> Finding:
        title = "driver and CUDA versions"
        if self.inventory is None:
            return skipped("driver", title, "NVML did not load (see above)")
        inv = self.inventory
        return passed("driver", title, f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}")

    def gpus(self) -> Finding:
        title = "GPUs visible to NVML vs NVIDIA GPUs on the PCI bus"
        on_bus = self._pci_gpus()
        bus_text = (
            f"{self.where.sysfs} is not readable" if on_bus is None else f"the PCI bus has {len(on_bus)}"
        )
        if self.inventory is None:
            if on_bus is not None and not on_bus:
                return failed(
                    "gpus",
                    title,
                    "no NVIDIA GPU on this node's PCI bus and NVML did not load",
                    "deploy the plugin only to GPU nodes (nodeSelector or node affinity)",
                )
            return skipped("gpus", title, f"{bus_text}; NVML did not load")
        seen = {_pci_bus(g.pci_bus_id) for g in self.inventory.gpus}
        lost = [f"GPU {g.index} ({g.uuid or 'UUID unknown'}): {g.reason}" for g in self.inventory.lost]
        missing = sorted((on_bus or set()) - seen)
        detail = f"NVML sees {len(seen)} GPU(s), {bus_text}"
        if lost or missing:
            problems = "; ".join(
                [*lost, *(f"{bus} is on the bus but not visible to NVML" for bus in missing)]
            )
            return failed(
                "gpus",
                title,
                f"{detail}: {problems}",
                "check `nvidia-smi` on the host and the kernel log for XID errors (XID 79: the GPU "
                "fell off the bus; reset or reboot); in a container, NVIDIA_VISIBLE_DEVICES must be "
                "all (the chart sets it)",
            )
        return passed("gpus", title, detail)

    def _pci_gpus(self) -> set[str] | None:
        """Bus IDs of the NVIDIA GPUs in sysfs; None when sysfs cannot be read."""
        found = set()
        devices = self.where.sysfs / "bus" / "pci" / "devices"
        try:
            entries = list(devices.iterdir())
        except OSError:
            return None
        for entry in entries:
            vendor = (_read(entry / "vendor") or "").strip()
            klass = (_read(entry / "class") or "").strip()
            if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES):
                found.add(_pci_bus(entry.name))
        return found

    def runtime(self) -> Finding:
        if self.where.context == "container":
            return self._runtime_in_container()
        return self._runtime_on_host()

    def _runtime_in_container(self) -> Finding:
        from nvdp.plugin.servicer import container_dev_root

        title = "the container runtime injected the NVIDIA driver"
        ctl = Path(container_dev_root(self.config)) / "dev" / "nvidiactl"
        visible = self.where.env.get("NVIDIA_VISIBLE_DEVICES", "")
        missing = []
        if not ctl.exists():
            missing.append(f"no {ctl}")
        if self.nvml_error is not None and "was not found" in self.nvml_error:
            missing.append("no libnvidia-ml.so.1 (`could not load NVML library`)")
        if missing:
            hint = "" if visible else "; NVIDIA_VISIBLE_DEVICES is not set either"
            return failed("runtime", title, f"{' and '.join(missing)} in this container{hint}", FIX_RUNTIME)
        return passed("runtime", title, f"{ctl} present, NVIDIA_VISIBLE_DEVICES={visible or '(unset)'}")

    def _runtime_on_host(self) -> Finding:
        title = "NVIDIA driver and container runtime on this node"
        ctl = Path(self.config.flags.dev_root) / "dev" / "nvidiactl"
        if not ctl.exists():
            return failed(
                "runtime",
                title,
                f"no {ctl}: the NVIDIA kernel driver is not loaded",
                "install the NVIDIA driver and load it (`modprobe nvidia`; `nvidia-smi` must work)",
            )
        containerd = _read(self.where.etc / "containerd" / "config.toml")
        docker = _read(self.where.etc / "docker" / "daemon.json")
        if containerd is None and docker is None:
            return passed("runtime", title, f"{ctl} present; no containerd or docker config found to check")
        configured = [
            name
            for name, text in (("containerd", containerd), ("docker", docker))
            if text is not None and "nvidia" in text
        ]
        if not configured:
            return failed(
                "runtime",
                title,
                f"{ctl} present, but neither containerd nor docker has an nvidia "
                "runtime, so no container gets the driver",
                "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure "
                "--runtime=containerd --set-as-default` (or --runtime=docker), then restart it",
            )
        default = (containerd is not None and 'default_runtime_name = "nvidia"' in containerd) or (
            docker is not None and '"default-runtime": "nvidia"' in docker
        )
        note = (
            "nvidia is the default runtime"
            if default
            else "nvidia is not the default runtime: the plugin needs chart value runtimeClassName: nvidia"
        )
        return passed("runtime", title, f"{ctl} present; nvidia runtime in {', '.join(configured)}; {note}")

    # --- 5-6: the kubelet ------------------------------------------------------------------------

    def kubelet(self) -> Finding:
        title = "kubelet device-plugin socket"
        path = self.config.flags.plugin.kubelet_socket_path
        fix = (
            "start the kubelet, or point the plugin at its socket: chart value devicePlugin.kubeletRootDir "
            "(k3s: /var/lib/rancher/k3s/agent/kubelet, microk8s: /var/snap/microk8s/common/var/lib/kubelet), "
            "env DEVICE_PLUGIN_PATH / KUBELET_SOCKET; on Kubernetes before 1.10 the kubelet also needs "
            "--feature-gates=DevicePlugins=true"
        )
        if not os.path.exists(path):
            return failed("kubelet", title, f"no kubelet socket at {path}", fix)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            try:
                sock.connect(path)
            except OSError as err:
                return failed(
                    "kubelet", title, f"{path} exists but does not accept connections ({err.strerror})", fix
                )
        return passed("kubelet", title, f"{path} accepts connections")

    def _plan(self) -> Plan | None:
        from nvdp.plan import PlanError, plan

        if self.inventory is None or not self.config_valid:
            return None
        try:
            return plan(self.config, self.inventory)
        except PlanError:
            return None

    def registration(self) -> Finding:
        from nvdp.plugin.grpc_client import server_answers
        from nvdp.plugin.owned_socket import socket_path_for

        title = "the plugin serves and is registered"
        if self.plan is None:
            why = "NVML did not load" if self.inventory is None else "the config is not usable (see below)"
            return skipped("registration", title, f"cannot tell which resources to expect: {why}")
        if not self.plan.resources:
            return passed("registration", title, "nothing to serve: the plan has no resources on this node")
        registered, how = self._registered()
        problems, served = [], []
        for resource in self.plan.resources:
            path = socket_path_for(resource, self.config)
            if not os.path.exists(path):
                problems.append(f"{resource.name}: no plugin socket {path}")
                continue
            silent = server_answers(path)
            if silent:
                problems.append(f"{resource.name}: the plugin {silent}")
            elif registered is not None and resource.name not in registered:
                problems.append(f"{resource.name}: served, but not registered with the kubelet ({how})")
            else:
                served.append(resource.name)
        if problems:
            fix = (
                FIX_SCHEDULING
                if any("no plugin socket" in p for p in problems)
                else (
                    "read the plugin's log (`kubectl logs` of the plugin pod): it says why registration fails"
                )
            )
            return failed("registration", title, "; ".join(problems), fix)
        state = (
            f"registered ({how})"
            if registered is not None
            else "registration not verifiable (no /readyz, no kubelet checkpoint)"
        )
        return passed("registration", title, f"{', '.join(served)} served; {state}")

    def _registered(self) -> tuple[set[str] | None, str]:
        """Resources the kubelet knows: from the plugin's /readyz, else the kubelet's checkpoint."""
        for variable in ("HEALTH_ADDRESS", "METRICS_ADDRESS"):
            address = self.where.env.get(variable, "")
            if not address:
                continue
            host, _, port = address.rpartition(":")
            host = "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host.strip("[]")
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=3) as answer:
                    body = answer.read().decode()
            except OSError as err:
                body = getattr(err, "read", lambda: b"")().decode() if hasattr(err, "read") else ""
            if body:
                names = {
                    line.split(": ", 1)[0] for line in body.splitlines() if line.endswith(": registered")
                }
                return names, "per the plugin's /readyz"
        checkpoint = _read(Path(self.config.flags.plugin.device_plugin_path) / CHECKPOINT)
        if checkpoint:
            try:
                data = json.loads(checkpoint)["Data"]["RegisteredDevices"] or {}
                return set(data), "per the kubelet's checkpoint"
            except (ValueError, KeyError, TypeError):
                pass
        return None, ""

    # --- 7-9: config, MPS, MIG -------------------------------------------------------------------

    def config_check(self) -> Finding:
        from nvdp.config.cli import summary

        title = "the config validates"
        if not self.config_valid:
            return failed(
                "config",
                title,
                self.config_error or "invalid",
                "correct the config (each problem above names its line, key and the valid values); "
                "check it before rolling it out with `nvdp config validate FILE`",
            )
        chosen = f" ({self.entry})" if self.entry else ""
        return passed("config", title, f"from {self.config.source}{chosen}: {summary(self.config)}")

    def mps(self) -> list[Finding]:
        title = "the MPS control daemon answers"
        if self.plan is None:
            return [skipped("mps", title, "no plan (see above)")]
        shared = [r for r in self.plan.resources if r.sharing == "mps"]
        if not shared:
            return [passed("mps", title, "no resource is shared with MPS")]
        return [self._mps_resource(r.name) for r in shared]

    def _mps_resource(self, name: str) -> Finding:
        from nvdp.mps.paths import container_root, shm_dir
        from nvdp.mps.status import read_status
        from nvdp.plugin.mps_gate import MPS_CAPABLE_LABEL, MpsGate

        title = f"the MPS control daemon answers for {name}"
        gate = MpsGate.from_env(name, logging.getLogger("nvdp.doctor"), self.where.env)
        problem = gate.problem()
        shm_problem = self._shm_problem(shm_dir(container_root(self.where.env)))
        if problem is None and shm_problem is None:
            return passed("mps", title, f"it answers at {gate.paths.pipe_dir}")
        node = self.where.node_name or "<node>"
        causes, fixes = [], []
        status = read_status(gate.paths.status_file)
        daemon_reports = status is not None and status.is_current()  # its pod runs, but the daemon fails
        if problem is not None and not daemon_reports and not gate.paths.ready_marker.exists():
            key, _, value = MPS_CAPABLE_LABEL.partition("=")
            labels = self.where.node_labels()
            if labels is None:
                causes.append(
                    f"the daemon is not running on this node (no {gate.paths.ready_marker}); the node "
                    f"label {MPS_CAPABLE_LABEL} could not be read (no API access)"
                )
                fixes.append(
                    f"`kubectl get node {node} -L {key}`; if empty: `kubectl label node {node} "
                    f"{MPS_CAPABLE_LABEL}`; else see the MPS daemon pod's state and log"
                )
            elif labels.get(key) != value:
                causes.append(
                    f"node {node} lacks the label {MPS_CAPABLE_LABEL}, so the chart does not run the "
                    "MPS daemon here"
                )
                fixes.append(f"kubectl label node {node} {MPS_CAPABLE_LABEL}")
            else:
                causes.append(f"node {node} has {MPS_CAPABLE_LABEL} but the MPS daemon is not ready")
                fixes.append(
                    "see the MPS daemon pod on this node: `kubectl -n <namespace> get pods -o wide "
                    f"--field-selector spec.nodeName={node}` and its log"
                )
        elif problem is not None:
            causes.append(problem)
            fixes.append("see the MPS daemon pod's log on this node")
        if shm_problem is not None:
            causes.append(shm_problem)
            fixes.append(
                "restart the plugin pod after the MPS daemon's init container has mounted "
                "<mps.root>/shm (the chart mounts it at /dev/shm in both pods)"
            )
        return failed("mps", title, "; ".join(causes), "; ".join(fixes))

    def _shm_problem(self, shared: Path) -> str | None:
        if self.where.context != "container":
            return None
        try:
            mine, theirs = os.stat(self.where.shm), os.stat(shared)
        except OSError as err:
            return f"cannot compare /dev/shm with {shared}: {err.strerror}"
        if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
            return f"{self.where.shm} is not {shared}, so MPS clients and the daemon would not share memory"
        return None

    def mig(self) -> Finding:
        title = "MIG monitoring permissions"
        strategy = self.config.flags.mig_strategy
        enabled = [g for g in (self.inventory.gpus if self.inventory else ()) if g.mig_enabled]
        if not enabled and strategy == "none":
            if self.inventory is None:
                return skipped(
                    "mig", title, "migStrategy is none; NVML did not load to tell the GPUs' MIG mode"
                )
            return passed("mig", title, "MIG is not in use (no GPU in MIG mode, migStrategy none)")
        status = _read(self.where.proc / "self" / "status") or ""
        caps = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
        problems = []
        if not int(caps, 16) >> CAP_SYS_ADMIN & 1:
            problems.append("the process lacks CAP_SYS_ADMIN")
        if self.where.context == "container" and self.where.env.get("NVIDIA_MIG_MONITOR_DEVICES") != "all":
            problems.append("NVIDIA_MIG_MONITOR_DEVICES is not all")
        where = f"{len(enabled)} GPU(s) in MIG mode, migStrategy {strategy}"
        if problems:
            return failed(
                "mig",
                title,
                f"{where}; {' and '.join(problems)}: MIG devices cannot be watched for health events",
                "set chart value migStrategy (single or mixed): it adds SYS_ADMIN and "
                "NVIDIA_MIG_MONITOR_DEVICES=all; outside the chart, run with both",
            )
        return passed("mig", title, f"{where}; CAP_SYS_ADMIN present")
