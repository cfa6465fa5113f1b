"""Run nvdp against this machine's real GPUs and driver, and report what each stage saw.

For a machine with an NVIDIA driver (no Kubernetes needed): the same stages the stand-in NVML
covers in the tests, on real hardware. Each stage is timed and reported on its own, so one that
fails does not hide the others:

  inventory   the GPUs as nvdp reads them through NVML (discover)
  recheck     the health re-check of each GPU (nvdp.health.checks) and which readings this GPU and
              driver have; its cost per GPU
  events      NVML event registration for XIDs, as the health monitor does it
  plan        the resources under the default config and under time-slicing x4
  dra         the DRA devices the node would publish (one ResourceSlice)
  gfd         `gpu-feature-discovery --oneshot` labels
  doctor      `nvdp doctor --context host` (no kubelet here: its kubelet checks fail, as they should)
  cdi         `nvdp cdi generate` on the real driver files
  plugin      the real plugin process serving the kubelet simulator: registration, devices,
              Allocate, GetPreferredAllocation, a clean stop (default config and time-slicing x4)
  recovery    the health record's GPU re-checked through the driver by the running plugin: back after
              the quiet period (XID 94), held for a reset then cleared by hand (XID 48)
  mps         only with --mps and the driver's nvidia-cuda-mps-control on PATH: the MPS control
              daemon and the plugin with 4 MPS replicas, then a CUDA client (python3 + torch) run
              with the environment the plugin's Allocate gave; compute mode restored after
  mig         only with --mig: NVML's MIG mode, GPU-instance profiles and their possible placements,
              read only (no MIG mode change, no instance created)
  xid         only with --xid: a CUDA kernel that faults (python3 + cupy), every XID counted: the
              GPU goes Unhealthy on the driver's XID and comes back after a 3 s quiet period;
              with --nvidia-plugin BINARY, NVIDIA's plugin beside it sees the same XID

    python scripts/gpu_node_check.py [--out DIR] [--mps] [--mig] [--xid [--nvidia-plugin BINARY]]
                                     [--sim PROFILE] [--stages a,b]

`--sim PROFILE` runs every stage against the stand-in NVML instead (for trying the script where
there is no GPU). The report goes to stdout and, with --out, to DIR/gpu-node-check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

Report = dict[str, Any]
TIME_SLICING_X4 = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                   "      - name: nvidia.com/gpu\n        replicas: 4\n")
MPS_X4 = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
SIM_ENV = "NVDP_GPU_CHECK_SIM"  # set in the re-executed script: the stand-in is in place
# A store to an address no allocation maps: the context faults and the driver reports an XID.
FAULTING_KERNEL = (
    "import cupy as cp\n"
    "k = cp.RawKernel(r'extern \"C\" __global__ void f(int* p) { *(volatile int*)(p + (1L << 40)) = 1; }',\n"
    "                 'f')\n"
    "k((1,), (1,), (cp.zeros(1, dtype=cp.int32),))\n"
    "cp.cuda.runtime.deviceSynchronize()\n"
)
CUDA_CLIENT = ("import torch; x = torch.ones(1 << 20, device='cuda'); "
               "print('cuda client sum', int(x.sum().item()), torch.cuda.get_device_name(0))")


def stage_inventory(ctx: Context) -> Report:
    from nvdp.inventory.nvml import discover

    started = time.perf_counter()
    inventory = discover()
    took = time.perf_counter() - started
    ctx.inventory = inventory
    return {
        "discover_ms": round(took * 1000, 1),
        "driver": inventory.driver_version,
        "cuda": inventory.cuda_driver_version,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "architecture": g.architecture,
                  "brand": g.brand,
                  "memory_mib": g.memory_bytes >> 20, "compute_capability": list(g.compute_capability),
                  "minor": g.minor, "pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node,
                  "pcie_root": g.pcie_root, "mig_capable": g.mig_capable, "mig_enabled": g.mig_enabled,
                  "mig_devices": len(g.mig_devices), "fabric": g.fabric is not None}
                 for g in inventory.gpus],
        "lost": [{"index": g.index, "reason": g.reason} for g in inventory.lost],
        "links": len(inventory.links),
    }


def stage_recheck(ctx: Context) -> Report:
    import pynvml

    from nvdp.health.checks import FIELD_RECOVERY_ACTION, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC, check_gpu

    pynvml.nvmlInit()
    try:
        out: Report = {}
        for gpu in ctx.gpus():
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            readings = {
                "retired_pages_pending": lambda h=handle: int(
                    pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
                "remapped_rows": lambda h=handle: list(pynvml.nvmlDeviceGetRemappedRows(h)),
                "uncorrected_ecc_volatile": lambda h=handle: int(
                    pynvml.nvmlDeviceGetTotalEccErrors(h, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC)),
                "recovery_action_field": lambda h=handle: _field(pynvml, h, FIELD_RECOVERY_ACTION),
            }
            raw = {name: _reading(pynvml, read) for name, read in readings.items()}
            check = check_gpu(pynvml, gpu.uuid)
            times = []
            for _ in range(50):
                started = time.perf_counter()
                check_gpu(pynvml, gpu.uuid)
                times.append(time.perf_counter() - started)
            out[gpu.uuid] = {
                "readings": raw,
                "check": {f: getattr(check, f) for f in check.__struct_fields__},
                "check_ms_p50": round(statistics.median(times) * 1000, 3),
                "check_ms_max": round(max(times) * 1000, 3),
            }
        # The driver's own account of the same readings, to compare.
        smi = subprocess.run(["nvidia-smi", "-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER"], env=ctx.env,
                             capture_output=True, text=True, check=False, timeout=30)
        out["nvidia_smi"] = smi.stdout[-4000:] if smi.returncode == 0 else smi.stderr.strip()
        return out
    finally:
        pynvml.nvmlShutdown()


def stage_events(ctx: Context) -> Report:
    import pynvml

    pynvml.nvmlInit()
    try:
        out: Report = {}
        event_set = pynvml.nvmlEventSetCreate()
        try:
            for gpu in ctx.gpus():
                handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                supported = _reading(pynvml, partial(pynvml.nvmlDeviceGetSupportedEventTypes, handle))
                registered = _reading(pynvml, partial(pynvml.nvmlDeviceRegisterEvents, handle,
                                                      pynvml.nvmlEventTypeXidCriticalError, event_set))
                out[gpu.uuid] = {"supported_types": supported, "xid_registration": registered or "ok"}
            started = time.perf_counter()
            waited = _reading(pynvml, lambda: pynvml.nvmlEventSetWait_v2(event_set, 500))
            out["wait_500ms"] = {"result": str(waited),
                                 "took_ms": round((time.perf_counter() - started) * 1000)}
        finally:
            pynvml.nvmlEventSetFree(event_set)
        return out
    finally:
        pynvml.nvmlShutdown()


def stage_plan(ctx: Context) -> Report:
    from nvdp.config.loader import load_config_text
    from nvdp.plan.build import plan
    from nvdp.plan.summary import plan_summary_rows

    out: Report = {}
    for name, text in (("default", None), ("time-slicing-x4", TIME_SLICING_X4), ("mps-x4", MPS_X4)):
        config = load_config_text(text.encode() if text else None, name, {})
        started = time.perf_counter()
        result = plan(config, ctx.need_inventory())
        out[name] = {"plan_ms": round((time.perf_counter() - started) * 1000, 2),
                     "resources": plan_summary_rows(result, ctx.inventory),
                     "warnings": list(result.warnings),
                     "excluded": [e.reason for e in result.excluded]}
    return out


def stage_dra(ctx: Context) -> Report:
    # The DRA plugin's own functions, under the default config, as `nvdp dra slices` computes them.
    from nvdp.config.loader import load_config
    from nvdp.dra.pool.contents import pool_devices, published_slices
    from nvdp.dra.pool.names import DEFAULT_DRIVER

    devices = pool_devices(load_config(None, {}, {}), ctx.need_inventory())
    return {"slices": published_slices("dra", node="gpu-node", node_uid="", driver=DEFAULT_DRIVER,
                                       devices=devices)}


def stage_mig(ctx: Context) -> Report:
    """NVML's MIG answers for each GPU, read only (no MIG mode change, no instance made): its MIG mode,
    every GPU-instance profile it knows (slices, memory, engines) and that profile's possible
    placements, and how many more instances of each would fit now."""
    import ctypes

    import pynvml as n

    def attempt(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except n.NVMLError as err:
            return f"NVMLError: {err}"

    def placements(handle: Any, profile_id: int) -> Any:
        count = ctypes.c_uint(0)
        function = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
        status = function(handle, profile_id, None, ctypes.byref(count))
        if status not in (n.NVML_SUCCESS, n.NVML_ERROR_INSUFFICIENT_SIZE):
            return f"NVMLError: {n.NVMLError(status)}"
        slots = (n.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        status = function(handle, profile_id, slots, ctypes.byref(count))
        if status != n.NVML_SUCCESS:
            return f"NVMLError: {n.NVMLError(status)}"
        return [[slots[i].start, slots[i].size] for i in range(count.value)]

    def profiles_of(handle: Any) -> list[Report]:
        profiles: list[Report] = []
        for profile in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = attempt(partial(n.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile))
            if isinstance(info, str):
                profiles.append({"profile": profile, "info": info})
                continue
            fields = {name: getattr(info, name) for name, _ in info._fields_ if name != "version"}
            if isinstance(fields.get("name"), bytes):
                fields["name"] = fields["name"].decode()
            profiles.append({
                "profile": profile, "info": fields, "placements": placements(handle, info.id),
                "remaining": attempt(partial(n.nvmlDeviceGetGpuInstanceRemainingCapacity, handle, info.id)),
            })
        return profiles

    n.nvmlInit()
    try:
        gpus = []
        for index in range(n.nvmlDeviceGetCount()):
            handle = n.nvmlDeviceGetHandleByIndex(index)
            gpus.append({"index": index, "name": n.nvmlDeviceGetName(handle),
                         "mig_mode": attempt(partial(n.nvmlDeviceGetMigMode, handle)),
                         "profiles": profiles_of(handle)})
        return {"gpus": gpus}
    finally:
        n.nvmlShutdown()


def stage_gfd(ctx: Context) -> Report:
    labels = ctx.workdir / "gfd-labels"
    done = ctx.run_python(["-m", "nvdp.gfd.main", "--oneshot", "--no-timestamp",
                           "--use-node-feature-api=false", "--output-file", str(labels)])
    text = labels.read_text() if labels.exists() else ""
    return {"exit": done.returncode,
            "labels": dict(line.split("=", 1) for line in text.splitlines() if "=" in line),
            "log_tail": (done.stdout + done.stderr)[-2000:]}


def stage_doctor(ctx: Context) -> Report:
    done = ctx.run_python(["-m", "nvdp.cli", "doctor", "--context", "host", "--json"])
    try:
        findings: Any = json.loads(done.stdout)
    except ValueError:
        findings = done.stdout[-3000:]
    return {"exit": done.returncode, "findings": findings, "stderr_tail": done.stderr[-1500:]}


def stage_cdi(ctx: Context) -> Report:
    # The driver as this machine has it (its files found from / and the loader's cache); a machine
    # without the NVIDIA Container Toolkit has no CDI hook, so the second try writes no hooks.
    attempts: list[str] = []
    for hooks in ("", "all"):
        done = ctx.run_python(["-m", "nvdp.cli", "cdi", "generate", "--driver-root", "/", "--output", "-"],
                              env={"DRIVER_ROOT_CTR_PATH": "/", "CDI_DISABLE_HOOKS": hooks})
        attempts.append(f"driver root /, disabled hooks {hooks or 'none'}: exit {done.returncode} "
                        f"{done.stderr.strip()[:700]}")
        if done.returncode == 0:
            break
    specs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = []
    for spec in specs:
        edits = spec.get("containerEdits", {})
        summary.append({
            "kind": spec.get("kind"),
            "devices": [d.get("name") for d in spec.get("devices", [])],
            "device_nodes": [n.get("path") for d in spec.get("devices", [])
                             for n in d.get("containerEdits", {}).get("deviceNodes", [])],
            "common_device_nodes": [n.get("path") for n in edits.get("deviceNodes", [])],
            "mounts": len(edits.get("mounts", [])),
            "mount_sample": [m.get("containerPath") for m in edits.get("mounts", [])][:8],
            "hooks": [h.get("args", [])[:3] for h in edits.get("hooks", [])],
            "env": edits.get("env", []),
        })
    return {"exit": done.returncode, "attempts": attempts, "specs": summary}


def stage_plugin(ctx: Context) -> Report:
    out: Report = {}
    for name, text in (("default", None), ("time-slicing-x4", TIME_SLICING_X4)):
        with ctx.plugin(name, text) as served:
            out[name] = served.report()
    return out


def stage_recovery(ctx: Context) -> Report:
    """The health rules on the real driver: a GPU the record holds down (as after an XID, which cannot
    be raised on purpose here) is re-checked through NVML by the running plugin. XID 94 (comes back
    after the quiet period once NVML finds the GPU fine), then XID 48 (needs a reset: stays down on a
    clean GPU, comes back when cleared by hand)."""
    from nvdp.health.ledger import Cause, Ledger, Settings
    from nvdp.health.state import write_state
    from nvdp.health.xids import describe, xid_info

    gpu = ctx.gpus()[0].uuid
    out: Report = {"gpu": gpu}
    for xid in (94, 48):
        state_dir = ctx.workdir / f"health-{xid}"
        ledger = Ledger(Settings(after=3.0))
        now = time.time()
        ledger.fault(gpu, [gpu], Cause(describe(xid), xid_info(xid).remedy, xid), now)
        write_state(str(state_dir), "nvidia-device-plugin", ledger.record(), now)
        extra = {"HEALTH_STATE_DIR": str(state_dir), "HEALTH_RECOVERY_AFTER": "3s"}
        with ctx.plugin(f"recovery-{xid}", None, extra_env=extra) as served:
            kubelet = served.kubelet
            started = time.monotonic()
            timeline = _health_timeline(kubelet, started, until=started + 10)
            step: Report = {"timeline": timeline}
            if timeline and timeline[-1][1] != "Healthy":
                shown = ctx.run_python(["-m", "nvdp.cli", "health", "--state-dir", str(state_dir)])
                step["nvdp_health"] = shown.stdout.strip() or shown.stderr.strip()
                cleared = time.monotonic()
                clear = subprocess.Popen([sys.executable, "-m", "nvdp.cli", "health", "--state-dir",
                                          str(state_dir), "clear", gpu], env=ctx.env)
                step["after_clear"] = _health_timeline(kubelet, cleared, until=cleared + 10)
                clear.wait(10)
            step["log"] = served.log_path.read_text()[-2500:]
        out[f"xid-{xid}"] = step
    return out


def stage_xid(ctx: Context) -> Report:
    """A real XID, end to end: a CUDA kernel writes to an unmapped address (the driver reports an XID,
    13 or 31, for the faulting context), with every XID counted (DP_ENABLE_HEALTHCHECKS=all): the
    plugin takes the GPU down and brings it back after a 3 s quiet period through the NVML re-check.
    With --nvidia-plugin, NVIDIA's plugin serves its own kubelet simulator beside it and sees the same
    XID."""
    state_dir = ctx.workdir / "health-xid"
    extra = {"HEALTH_STATE_DIR": str(state_dir), "HEALTH_RECOVERY_AFTER": "3s",
             "DP_ENABLE_HEALTHCHECKS": "all"}
    out: Report = {}
    with ExitStack() as stack:
        served = stack.enter_context(ctx.plugin("xid", None, extra_env=extra))
        kubelets = {"nvdp": served.kubelet}
        if ctx.nvidia_plugin is not None:
            every_xid = {"DP_ENABLE_HEALTHCHECKS": "all"}
            kubelets["nvidia"], nvidia_log = stack.enter_context(ctx.nvidia(every_xid))
        for name, each in kubelets.items():
            resource = each.wait_for_registration(20)
            devices = each.wait_for_resource(resource, healthy=1, timeout=10)
            out[f"{name}_allocate"] = each.allocate(resource, [[devices[0]["id"]]])
        started = time.monotonic()
        # On the stand-in, its own XID stands in for the kernel's.
        faulting = ["python3", "-c", FAULTING_KERNEL] if SIM_ENV not in os.environ else [
            sys.executable, "-m", "sim.nvml", "inject-xid", "--state-dir", os.environ["NVML_SIM_STATE_DIR"],
            "--uuid", ctx.gpus()[0].uuid, "--xid", "31"]
        env = dict(ctx.env, PYTHONPATH=f"{ROOT}{os.pathsep}{ctx.env['PYTHONPATH']}")
        client = subprocess.Popen(faulting, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        # Watched until nvdp's GPU is back, and NVIDIA's for 10 s more.
        timelines = _health_timelines(kubelets, started, until=started + 60, leave="Unhealthy", linger=10)
        out["timeline"] = timelines["nvdp"]
        if "nvidia" in timelines:
            out["nvidia_timeline"] = timelines["nvidia"]
            out["nvidia_log"] = nvidia_log.read_text()[-3000:]
        output, _ = client.communicate(timeout=60)
        out["faulting_client"] = {"exit": client.returncode, "output_tail": output.strip()[-400:]}
        out["log"] = served.log_path.read_text()[-3000:]
    kernel = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
    out["kernel_xids"] = [line for line in kernel.stdout.splitlines() if "Xid" in line][-5:] or kernel.stderr
    return out


def _health_timeline(kubelet: Any, started: float, until: float, leave: str = "") -> list[tuple[float, str]]:
    """(seconds since `started`, the device's health) at each change, until it is Healthy after having
    been `leave` (given) or at all (not given), or `until`."""
    return _health_timelines({"one": kubelet}, started, until, leave)["one"]


def _health_timelines(kubelets: dict[str, Any], started: float, until: float, leave: str = "",
                      linger: float = 0.0) -> dict[str, list[tuple[float, str]]]:
    """Each kubelet's timeline (as _health_timeline), watched together: until the first kubelet's device
    is Healthy after having been `leave` (or at all), then `linger` seconds more for the others (whose
    last entry is their health at the end); or until `until`."""
    timelines: dict[str, list[tuple[float, str]]] = {name: [] for name in kubelets}
    first = next(iter(kubelets))
    done_at: float | None = None
    while time.monotonic() < until and (done_at is None or time.monotonic() < done_at + linger):
        for name, kubelet in kubelets.items():
            devices = [d for resource in kubelet.resources() for d in kubelet.devices(resource)]
            health = devices[0]["health"] if devices else "no device list"
            timeline = timelines[name]
            if not timeline or timeline[-1][1] != health:
                timeline.append((round(time.monotonic() - started, 2), health))
        back = timelines[first][-1][1] == "Healthy"
        if done_at is None and back and (not leave or any(h == leave for _, h in timelines[first])):
            done_at = time.monotonic()
            if not linger:
                break
        time.sleep(0.05)
    for name, timeline in timelines.items():
        if name != first and timeline:
            timeline.append((round(time.monotonic() - started, 2), timeline[-1][1]))
    return timelines


def stage_mps(ctx: Context) -> Report:
    if not shutil.which("nvidia-cuda-mps-control", path=ctx.env.get("PATH")):
        return {"skipped": "nvidia-cuda-mps-control is not on PATH"}
    out: Report = {"compute_mode_before": _compute_modes(ctx)}
    root = ctx.workdir / "mps"
    with ctx.mps_daemon(root, MPS_X4) as daemon_log, ctx.plugin("mps-x4", MPS_X4, mps_root=root) as served:
        out["serve"] = served.report(timeout=60)
        out["compute_mode_serving"] = _compute_modes(ctx)
        response = out["serve"].get("allocate", {})
        client_env = _client_env(response, served.env)
        out["client_env"] = {k: v for k, v in client_env.items() if k.startswith(("CUDA_", "NVIDIA_"))}
        started = time.perf_counter()
        client = subprocess.run(["python3", "-c", CUDA_CLIENT], env=client_env, capture_output=True,
                                text=True, timeout=120, check=False)
        out["client"] = {"exit": client.returncode, "took_s": round(time.perf_counter() - started, 2),
                         "stdout": client.stdout[-500:], "stderr": client.stderr[-1500:]}
        pipe = client_env.get("CUDA_MPS_PIPE_DIRECTORY", "")
        servers = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", capture_output=True,
                                 text=True, timeout=20, check=False,
                                 env={**ctx.env, "CUDA_MPS_PIPE_DIRECTORY": pipe})
        out["server_list"] = servers.stdout.strip()
    out["daemon_log_tail"] = daemon_log.read_text()[-2500:] if daemon_log.exists() else ""
    out["compute_mode_after"] = _compute_modes(ctx)
    return out


STAGES: dict[str, Callable[[Context], Report]] = {
    "inventory": stage_inventory, "recheck": stage_recheck, "events": stage_events, "plan": stage_plan,
    "dra": stage_dra, "gfd": stage_gfd, "doctor": stage_doctor, "cdi": stage_cdi, "plugin": stage_plugin,
    "recovery": stage_recovery, "mps": stage_mps, "xid": stage_xid, "mig": stage_mig,
}


@dataclass(frozen=True)
class Served:
    """The real plugin process serving a kubelet simulator (Context.plugin)."""

    kubelet: Any  # sim.kubelet.KubeletSim
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    started: float  # time.perf_counter() just before the process was spawned

    def report(self, timeout: float = 20) -> Report:
        """Registration time, devices, one Allocate and a GetPreferredAllocation, and the log."""
        try:
            resource = self.kubelet.wait_for_registration(timeout, alive=lambda: self.process.poll() is None)
        except TimeoutError as err:
            return {"error": f"{err} (exit {self.process.poll()})",
                    "log_tail": self.log_path.read_text()[-3000:]}
        out: Report = {"registered_s": round(time.perf_counter() - self.started, 2), "resource": resource}
        devices = self.kubelet.wait_for_resource(resource, timeout=10)
        out["devices"] = [{"id": d["id"], "health": d["health"]} for d in devices]
        out["allocate"] = self.kubelet.allocate(resource, [[devices[0]["id"]]])
        if len(devices) > 1:
            out["preferred_2"] = self.kubelet.preferred(resource, [d["id"] for d in devices], [], 2)
        out["log"] = self.log_path.read_text()[-4000:]
        return out


class Context:
    """What the stages share: the environment the nvdp processes get, a work folder, the inventory."""

    def __init__(self, workdir: Path, nvidia_plugin: Path | None = None) -> None:
        self.workdir = workdir
        self.nvidia_plugin = nvidia_plugin
        self.env = dict(os.environ)
        paths = [str(ROOT / "src"), self.env.get("PYTHONPATH")]
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.inventory: Any = None

    def need_inventory(self) -> Any:
        if self.inventory is None:
            stage_inventory(self)
        return self.inventory

    def gpus(self) -> Any:
        return self.need_inventory().gpus

    def run_python(self, args: list[str], timeout: float = 120, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, check=False)

    @contextmanager
    def plugin(self, name: str, config: str | None, mps_root: Path | None = None,
               extra_env: dict[str, str] | None = None) -> Iterator[Served]:
        """The real plugin process serving a kubelet simulator, stopped with SIGTERM afterwards."""
        from sim.kubelet import KubeletSim
        from sim.processes import running

        plugin_dir = self.workdir / f"device-plugins-{name}"
        env = dict(self.env, DEVICE_PLUGIN_PATH=str(plugin_dir))
        if config:
            path = self.workdir / f"{name}.yaml"
            path.write_text(config)
            env["CONFIG_FILE"] = str(path)
        if mps_root is not None:
            env.update(MPS_ROOT=str(mps_root), MPS_CONTAINER_ROOT=str(mps_root))
        env.update(extra_env or {})
        log_path = self.workdir / f"plugin-{name}.log"
        with KubeletSim(plugin_dir) as kubelet:
            started = time.perf_counter()
            argv = [sys.executable, "-m", "nvdp.plugin.main"]
            with running(argv, env, log_path, stop_timeout=20) as process:
                yield Served(kubelet, process, log_path, env, started)

    @contextmanager
    def nvidia(self, extra_env: dict[str, str]) -> Iterator[tuple[Any, Path]]:
        """NVIDIA's plugin serving a kubelet simulator of its own. It has the kubelet's folder built in,
        so it runs in a private mount namespace where that folder is the simulator's
        (../shared/upstream/run_in_ns.sh, or a copy beside the binary; root)."""
        from sim.kubelet import KubeletSim
        from sim.processes import running

        assert self.nvidia_plugin is not None
        in_namespace = next((p for p in (self.nvidia_plugin.parent / "run_in_ns.sh",
                                         ROOT.parent / "shared" / "upstream" / "run_in_ns.sh") if p.exists()),
                            None)
        if in_namespace is None:
            raise FileNotFoundError("run_in_ns.sh is neither beside --nvidia-plugin nor in "
                                    "../shared/upstream")
        sockets = self.workdir / "nvidia-device-plugins"
        log_path = self.workdir / "nvidia-plugin.log"
        argv = ["bash", str(in_namespace), str(sockets), str(self.nvidia_plugin), "--fail-on-init-error=true"]
        env = dict(self.env, NS_OVL_DIR=str(self.workdir / "nvidia-ns"), **extra_env)
        with KubeletSim(sockets) as kubelet, running(argv, env, log_path, stop_timeout=20):
            yield kubelet, log_path

    @contextmanager
    def mps_daemon(self, root: Path, config: str) -> Iterator[Path]:
        from sim.processes import running

        path = self.workdir / "mps-daemon.yaml"
        path.write_text(config)
        env = dict(self.env, MPS_ROOT=str(root), MPS_CONTAINER_ROOT=str(root), CONFIG_FILE=str(path))
        log_path = self.workdir / "mps-daemon.log"
        with running([sys.executable, "-m", "nvdp.mps.main"], env, log_path, stop_timeout=30):
            yield log_path


def _client_env(response: Report, env: dict[str, str]) -> dict[str, str]:
    """The environment a container would get from the Allocate response, with container paths of its
    mounts mapped back to their host paths (this client runs on the host)."""
    container = response.get("container_responses", [{}])[0]
    client = {k: v for k, v in env.items() if not k.startswith(("CUDA_", "NVIDIA_"))}
    client.update(container.get("envs", {}))
    mounts = sorted(container.get("mounts", []), key=lambda m: -len(m["container_path"]))
    for key, value in list(client.items()):
        if not key.startswith("CUDA_MPS_"):
            continue
        for mount in mounts:
            if value == mount["container_path"] or value.startswith(mount["container_path"] + "/"):
                client[key] = mount["host_path"] + value[len(mount["container_path"]):]
                break
    visible = client.pop("NVIDIA_VISIBLE_DEVICES", "")
    if visible and visible not in ("all", "void", "none"):
        client["CUDA_VISIBLE_DEVICES"] = visible
    return client


def _compute_modes(ctx: Context) -> list[str]:
    done = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"], env=ctx.env,
                          capture_output=True, text=True, check=False, timeout=30)
    return done.stdout.split("\n")[:-1] if done.returncode == 0 else [f"nvidia-smi: {done.stderr.strip()}"]


def _field(pynvml: Any, handle: Any, field: int) -> Any:
    value = pynvml.nvmlDeviceGetFieldValues(handle, [field])[0]
    return {"nvmlReturn": int(value.nvmlReturn), "value": int(value.value.uiVal)}


def _reading(pynvml: Any, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except pynvml.NVMLError as err:
        return f"NVMLError: {err}"


def _run_on_stand_in(profile: str, argv: list[str]) -> int:
    """This script again, with the stand-in NVML (and stand-in nvidia-smi and MPS control) for `profile`:
    pynvml loads the library named by LD_LIBRARY_PATH, which only a new process reads."""
    from sim.mps import BIN_DIR as MPS_SIM_BIN
    from sim.nvml import NodeSim

    with tempfile.TemporaryDirectory(prefix="nvdp-gpu-check-sim-") as tmp:
        node = NodeSim(profile, Path(tmp) / "nvml-state")
        env = {**os.environ, **node.env, SIM_ENV: profile}
        env["PATH"] = os.pathsep.join([str(MPS_SIM_BIN), str(ROOT / "sim"), env.get("PATH", "")])
        return subprocess.run([sys.executable, __file__, *argv], env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, help="also write the report as JSON into this folder")
    parser.add_argument("--mps", action="store_true", help="also run the MPS stage (changes compute modes)")
    parser.add_argument("--xid", action="store_true", help="also run the XID stage (faults a CUDA context)")
    parser.add_argument("--nvidia-plugin", type=Path, metavar="BINARY",
                        help="NVIDIA's nvidia-device-plugin: the xid stage runs it beside nvdp (root)")
    parser.add_argument("--sim", metavar="PROFILE", help="use the stand-in NVML with this node profile")
    parser.add_argument("--stages", help="comma-separated subset of: " + ",".join(STAGES))
    parser.add_argument("--mig", action="store_true",
                        help="also run the MIG stage: NVML's profiles and possible placements, read only")
    args = parser.parse_args(argv)
    optional = {"mps": args.mps, "xid": args.xid, "mig": args.mig}
    names = args.stages.split(",") if args.stages else [s for s in STAGES if optional.get(s, True)]
    if args.sim and SIM_ENV not in os.environ:
        return _run_on_stand_in(args.sim, argv if argv is not None else sys.argv[1:])
    report: Report = {"host": os.uname().nodename, "python": sys.version.split()[0], "stages": {}}
    failed = 0
    with tempfile.TemporaryDirectory(prefix="nvdp-gpu-check-") as tmp:
        ctx = Context(Path(tmp), args.nvidia_plugin)
        for name in names:
            started = time.perf_counter()
            try:
                result = STAGES[name](ctx)
                result["stage_s"] = round(time.perf_counter() - started, 2)
                print(f"== {name}: done in {result['stage_s']} s", flush=True)
            except Exception as err:  # a stage's failure is part of the report, not the end of it
                failed += 1
                result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                print(f"== {name}: FAILED: {result['error']}", flush=True)
            print(json.dumps(result, indent=1, default=str), flush=True)
            report["stages"][name] = result
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-node-check.json").write_text(json.dumps(report, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
