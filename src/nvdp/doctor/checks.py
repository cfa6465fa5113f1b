"""The checks of `nvdp doctor`, in the order a broken GPU node is usually fixed.

Each check reads one thing (NVML, sysfs, /dev, the kubelet's directory, the config, the MPS root,
/proc) and says what it found; a failure carries the fix a user would otherwise have to dig out of
issue trackers: the driver not injected by the container runtime (`could not load NVML library`),
a kubelet socket elsewhere (k3s) or a kubelet without device plugins (Kubernetes < 1.10), a DaemonSet
not scheduled on the node, the MPS label, a `/dev/shm` not shared with the MPS daemon, MIG monitoring
without SYS_ADMIN. A check whose input failed earlier is SKIPped with that reason. Every check runs
within a time limit (`bounded.py`) and whatever it raises is its FAIL line: an NVML whose init never
returns, an API server answering HTML or refusing the connection end up in the report, not a hang or a
traceback. The kubelet, MPS and CDI checks live in `kubelet_check.py`, `mps_check.py` and `cdi_check.py`.
"""

from __future__ import annotations

from pathlib import Path

from nvdp.config.model import Config
from nvdp.doctor.api import LabelRead
from nvdp.doctor.bounded import TimedOut, checked, checked_all, within
from nvdp.doctor.cdi_check import CdiChecks
from nvdp.doctor.dra_check import DraChecks
from nvdp.doctor.health_check import TITLE as HEALTH_TITLE
from nvdp.doctor.health_check import health_findings
from nvdp.doctor.kubelet_check import KubeletChecks
from nvdp.doctor.mps_check import MpsChecks
from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.doctor.where import Context, Where, detect_context, read_text
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

__all__ = ["Context", "Doctor", "Where", "detect_context"]

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
CAP_SYS_ADMIN = 21
FIX_RUNTIME = (
    "run the plugin with the NVIDIA container runtime: chart value runtimeClassName: nvidia, or make "
    "nvidia the default runtime (containerd: `nvidia-ctk runtime configure --runtime=containerd "
    '--set-as-default`; docker: "default-runtime": "nvidia" in /etc/docker/daemon.json), restart the '
    "runtime, then delete the plugin pod so it is recreated"
)
FIX_NVML_HUNG = (
    "run `nvidia-smi` on the node: if it hangs too, the driver is stuck; look for Xid errors in the "
    "kernel log (`dmesg | grep -i -e xid -e nvrm`), then reset the GPU (`nvidia-smi -r`) or reboot the "
    "node. With persistence mode off every start initialises the GPUs, which can take long: enable it "
    "(the nvidia-persistenced service, or `nvidia-smi -pm 1`); `--check-timeout` allows more time"
)
FIX_NO_GPU = (
    "run `nvdp doctor` on a GPU node, or in the plugin's pod there (`kubectl exec <plugin pod> -- nvdp "
    "doctor`); deploy the plugin only to GPU nodes (nodeSelector or node affinity)"
)
FIX_NO_DRIVER = (
    "install the NVIDIA driver on this node (`nvidia-smi` must work), or pass --driver-root where it is "
    "installed (the GPU Operator's: /run/nvidia/driver)"
)
# A check that waits on something itself (NVML, a socket, HTTP) gets this much beyond its own limit.
GRACE_S = 5.0


def _split_fix(message: str) -> tuple[str, str]:
    head, sep, fix = message.partition(" Fix: ")
    return (head, fix) if sep else (message, "")


def _pci_bus(bus_id: str) -> str:
    """NVML's 00000000:3B:00.0 and sysfs's 0000:3b:00.0 as one form."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


class Doctor(KubeletChecks, MpsChecks, CdiChecks, DraChecks):
    def __init__(
        self,
        where: Where,
        config: Config | None,
        config_error: str | None,
        entry: str = "",
        label_read: LabelRead | None = None,
    ) -> None:
        self.where = where
        self.entry = entry  # per-node config: which entry and why
        self.label_read = label_read  # per-node config: how the node's label was read
        self.config = config or Config()
        self.config_valid = config is not None
        self.config_error = config_error
        self.inventory: Inventory | None = None
        self.nvml_error: str | None = None
        self.plan: Plan | None = None
        self._bus: tuple[set[str] | None] | None = None  # the PCI bus's NVIDIA GPUs, read once

    def run(self) -> list[Finding]:
        """Every check in order, each bounded in time; an error in one is its report line."""
        limit = self.where.timeout + GRACE_S
        findings = [
            checked("nvml", "NVML loads", self.nvml, limit),
            checked("driver", "driver and CUDA versions", self.driver, limit),
            checked("gpus", "GPUs visible to NVML vs NVIDIA GPUs on the PCI bus", self.gpus, limit),
            checked("runtime", "the NVIDIA driver and the container runtime", self.runtime, limit),
            checked("kubelet", "kubelet device-plugin socket", self.kubelet, limit),
        ]
        try:
            self.plan = self._plan()
        except Exception:  # the checks that need a plan say it is missing
            self.plan = None
        findings += [
            checked("registration", "the plugin serves and is registered", self.registration, limit),
            checked("config", "the config validates", self.config_check, limit),
        ]
        findings += checked_all("cdi", "the CDI specs and hook", self.cdi, limit)  # CDI strategies only
        # DRA nodes only; two gRPC calls and one API read, each bounded.
        findings += checked_all("dra", "the DRA kubelet plugin", self.dra, 2 * limit)
        findings += checked_all("mps", "the MPS control daemon answers", self.mps, 2 * limit)
        findings.append(checked("mig", "MIG monitoring permissions", self.mig, limit))
        # With a health record only (the chart's healthStateDir): the GPUs the plugin holds down.
        record_dir = self.config.flags.plugin.health_state_dir
        findings += checked_all("health", HEALTH_TITLE, lambda: health_findings(record_dir), limit)
        return findings

    # --- 1-4: the driver ------------------------------------------------------------------------

    def nvml(self) -> Finding:
        from pynvml import NVML_ERROR_LIBRARY_NOT_FOUND

        from nvdp.inventory.library import find_library
        from nvdp.inventory.nvml import NvmlUnavailable, discover

        title = "NVML loads"
        flags = self.config.flags
        seconds = self.where.timeout
        try:
            found = within(
                lambda: discover(flags.nvidia_driver_root, flags.plugin.container_driver_root),
                seconds,
                "doctor-nvml",
            )
        except NvmlUnavailable as err:
            self.nvml_error = str(err)
            detail, fix = _split_fix(str(err))
            reason = detail.split(":", 1)[0]  # "NVML is not available (ERROR_LIBRARY_NOT_FOUND)"
            if self.no_gpu_here():  # the NVML error is set above
                return failed("nvml", title, f"{reason}: this machine has no NVIDIA GPU (none on its PCI "
                              "bus), so no NVIDIA driver either", FIX_NO_GPU)
            if self.where.context == "host" and err.code in (None, NVML_ERROR_LIBRARY_NOT_FOUND):
                return failed("nvml", title, f"{reason}: libnvidia-ml.so.1 was not found under the "
                              f"driver root {flags.nvidia_driver_root} nor on the library path: the NVIDIA "
                              "driver is not installed here", FIX_NO_DRIVER)
            return failed("nvml", title, detail, fix or FIX_RUNTIME)
        if isinstance(found, TimedOut):
            self.nvml_error = f"NVML did not answer within {seconds:g} s"
            return failed(
                "nvml",
                title,
                f"{self.nvml_error}: nvmlInit (or a call after it) never returned, so the driver is hung "
                "or still initialising the GPUs",
                FIX_NVML_HUNG,
            )
        self.inventory = found
        loaded = self._loaded_library() or "libnvidia-ml.so.1"
        under_root = find_library(flags.plugin.container_driver_root) is not None
        origin = (
            f"found under the driver root mounted at {flags.plugin.container_driver_root}"
            if under_root
            else "found on the library search path (injected by the container runtime or installed)"
        )
        return passed("nvml", title, f"{loaded}, {origin}")

    def _loaded_library(self) -> str | None:
        maps = read_text(self.where.proc / "self" / "maps") or ""
        for line in maps.splitlines():
            if "libnvidia-ml.so" in line:
                return line.split(maxsplit=5)[-1]
        return None

    def driver(self) -> Finding:
        title = "driver and CUDA versions"
        if self.inventory is None:
            return skipped("driver", title, "NVML did not load (see its check above)")
        inv = self.inventory
        return passed("driver", title, f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}")

    def gpus(self) -> Finding:
        title = "GPUs visible to NVML vs NVIDIA GPUs on the PCI bus"
        on_bus = self.on_bus()
        bus_text = (
            f"{self.where.sysfs} is not readable" if on_bus is None else f"the PCI bus has {len(on_bus)}"
        )
        if self.inventory is None:
            if self.no_gpu_here():
                return skipped("gpus", title, "no NVIDIA GPU on this machine's PCI bus (see the NVML check)")
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

    def on_bus(self) -> set[str] | None:
        """The NVIDIA GPUs on the PCI bus (read once); None when sysfs cannot be read."""
        if self._bus is None:
            self._bus = (self._pci_gpus(),)
        return self._bus[0]

    def no_gpu_here(self) -> bool:
        """NVML did not load on a machine whose PCI bus holds no NVIDIA GPU: nothing of the driver
        or the container runtime is missing, the GPU is."""
        return self.inventory is None and self.nvml_error is not None and self.on_bus() == set()

    def _pci_gpus(self) -> set[str] | None:
        """Bus IDs of the NVIDIA GPUs in sysfs; None when sysfs cannot be read."""
        found = set()
        devices = self.where.sysfs / "bus" / "pci" / "devices"
        try:
            entries = list(devices.iterdir())
        except OSError:
            return None
        for entry in entries:
            vendor = (read_text(entry / "vendor") or "").strip()
            klass = (read_text(entry / "class") or "").strip()
            if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES):
                found.add(_pci_bus(entry.name))
        return found

    def runtime(self) -> Finding:
        if self.no_gpu_here():
            return skipped("runtime", "the NVIDIA driver and the container runtime", "no NVIDIA GPU on "
                           "this machine: nothing for a driver or container runtime to serve (see the NVML "
                           "check)")
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
        containerd = read_text(self.where.etc / "containerd" / "config.toml")
        docker = read_text(self.where.etc / "docker" / "daemon.json")
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

    def _plan(self) -> Plan | None:
        from nvdp.plan import PlanError, plan

        if self.inventory is None or not self.config_valid:
            return None
        try:
            return plan(self.config, self.inventory)
        except PlanError:
            return None

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
        detail = f"from {self.config.source}{chosen}: {summary(self.config)}"
        read = self.label_read
        if read is not None and read.error:
            return failed(
                "config",
                title,
                f"{detail}; the node's label could not be read, so this may not be the entry the label "
                f"names: {read.problem}",
                read.fix,
            )
        return passed("config", title, detail)

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
        status = read_text(self.where.proc / "self" / "status") or ""
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
