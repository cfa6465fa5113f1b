"""The stand-in NVML: build libnvidia-ml.so.1 from nvml_sim.c and drive a simulated node.

    with NodeSim("t4", tmp_path / "state") as node:
        subprocess.run([...], env={**os.environ, **node.env})   # real pynvml sees the profile's GPUs
        node.inject_xid(uuid, 48)                               # delivered by nvmlEventSetWait
        node.lose_gpu(uuid)                                     # GPU_IS_LOST from then on, plus XID 79
        node.pending_remap(uuid)                                # what a health re-check reads
        node.reset_gpu(uuid)                                    # as after a GPU reset: all of it cleared
        mig = node.mig_create(gpu_uuid, 9, 4)                   # nvidia-smi mig -cgi 9 -C, through NVML
        node.kill_after(2, pid)                                 # SIGKILL after pid's 2nd NVML change
        node.set_processes(uuid, [RunningProcess(4242, 1 << 30, sm_util=35)])  # what NVML lists on it

Run-time state lives in the state directory so that other processes (the plugin, the MPS daemon, a CLI)
see the same node: `lost/<uuid>` and `unanswering/<uuid>` markers, `compute-mode/<uuid>`, the memory
health files (README.md), the append-only `events` file, the MIG layouts `mig/<uuid>` and modes
`mig-mode/<uuid>`, the running processes `processes/<uuid>`, and the fault points `fault/kill-after`,
`fault/fail-after`. The library reads them at every call.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from msgspec import Struct

from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile

SIM_DIR = Path(__file__).resolve().parent
REPO_ROOT = SIM_DIR.parent.parent
PROFILES_DIR = SIM_DIR.parent / "profiles"
BUILD_DIR = REPO_ROOT / ".build" / "nvml-sim"
LIBRARY_NAME = "libnvidia-ml.so.1"
SOURCES = ("nvml_sim.c", "json.c", "json.h")
XID_GPU_FELL_OFF_BUS = 79
# The per-GPU state folders a GPU reset clears (reset_gpu), in this order, so that the GPU answers again
# only once the rest is clean; ecc-volatile is set to 0 first, ecc-aggregate is kept.
RESET_CLEARS = ("retired-pending", "remap-pending", "remap-failed", "recovery-action", "unanswering", "lost")


class BuildError(RuntimeError):
    """The stand-in library could not be compiled."""


def _compile_command(output: Path) -> list[str]:
    return [
        os.environ.get("CC", "gcc"), "-O2", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden",
        f"-DNVML_SIM_TO_JSON=\"{SIM_DIR / 'to_json.py'}\"", f"-Wl,-soname,{LIBRARY_NAME}",
        "-o", str(output), str(SIM_DIR / "nvml_sim.c"), str(SIM_DIR / "json.c"), "-lpthread",
    ]  # fmt: skip


def build_library(force: bool = False) -> Path:
    """Compile the stand-in into .build/nvml-sim/libnvidia-ml.so.1 unless it is up to date; returns its path.

    A file lock serialises parallel test processes; the library is replaced atomically so processes that
    already loaded the old one keep working.
    """
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    target = BUILD_DIR / LIBRARY_NAME
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((SIM_DIR / name).read_bytes())
    digest.update(" ".join(_compile_command(target)).encode())
    stamp = BUILD_DIR / "source.sha256"
    with open(BUILD_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and target.exists() and stamp.exists() and stamp.read_text() == digest.hexdigest():
            return target
        partial = BUILD_DIR / f"{LIBRARY_NAME}.{os.getpid()}.tmp"
        result = subprocess.run(_compile_command(partial), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise BuildError(f"compiling the stand-in NVML failed:\n{result.stderr}")
        os.replace(partial, target)
        stamp.write_text(digest.hexdigest())
    return target


def resolve_profile(profile: str | Path) -> Path:
    """A path as given, or a profile shipped in sim/profiles by name ("t4", "a100-sxm-8.yaml")."""
    path = Path(profile)
    if path.exists():
        return path.resolve()
    for candidate in (PROFILES_DIR / path.name, PROFILES_DIR / f"{path.name}.yaml"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"no node profile {profile!r} (shipped profiles: {', '.join(list_profiles())})")


def profile_as_json(profile: Path, target: Path) -> Path:
    """Write a YAML or JSON profile to `target` as JSON, so the library reads it without starting Python.

    The library can convert YAML itself, but only by forking an interpreter inside nvmlInit; in a
    process that already runs threads (gRPC, for one) that fork is slow and noisy.
    """
    with open(profile, encoding="utf-8") as f:
        document = yaml.safe_load(f)  # JSON is YAML too
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(document), encoding="utf-8")
    os.replace(partial, target)
    return target


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _append_event(state_dir: Path, uuid: str, xid: int) -> None:
    # One write of a whole line with O_APPEND: readers never see half an event.
    fd = os.open(state_dir / "events", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{uuid} {xid}\n".encode())
    finally:
        os.close(fd)


def inject_xid(state_dir: Path, uuid: str, xid: int) -> None:
    """Deliver an XID event for a GPU or MIG device to every process using this state directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    _append_event(state_dir, uuid, xid)


def lose_gpu(state_dir: Path, uuid: str) -> None:
    """Make a GPU fall off the bus: its calls return GPU_IS_LOST and an XID 79 event is delivered."""
    lost = state_dir / "lost"
    lost.mkdir(parents=True, exist_ok=True)
    (lost / uuid).touch()
    _append_event(state_dir, uuid, XID_GPU_FELL_OFF_BUS)


def _write_atomic(path: Path, text: str) -> None:
    # Written beside the target, then renamed: a process reading it sees the old or the new text, never half.
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _mark(state_dir: Path, folder: str, uuid: str, on: bool) -> None:
    marker = state_dir / folder / uuid
    if on:
        _write_atomic(marker, "")
    else:
        marker.unlink(missing_ok=True)


def _read_number(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def pending_retirement(state_dir: Path, uuid: str, on: bool = True) -> None:
    """Pages wait for retirement: nvmlDeviceGetRetiredPagesPendingStatus reports ENABLED (pre-Ampere GPUs)."""
    _mark(state_dir, "retired-pending", uuid, on)


def pending_remap(state_dir: Path, uuid: str, on: bool = True) -> None:
    """A row remap waits for a GPU reset: nvmlDeviceGetRemappedRows reports isPending 1 (Ampere and newer)."""
    _mark(state_dir, "remap-pending", uuid, on)


def remap_failure(state_dir: Path, uuid: str, on: bool = True) -> None:
    """Row remapping failed (the GPU has no spare rows left): nvmlDeviceGetRemappedRows failureOccurred 1."""
    _mark(state_dir, "remap-failed", uuid, on)


def ecc_errors(state_dir: Path, uuid: str, volatile: int, aggregate: int | None = None) -> None:
    """Set the uncorrected ECC error counts nvmlDeviceGetTotalEccErrors reports.

    `volatile` counts since the last driver load or GPU reset, `aggregate` over the GPU's life. Without
    `aggregate`, the aggregate count grows by as much as the volatile one grew, so that it stays at least
    as large, as on a real GPU.
    """
    if volatile < 0 or (aggregate is not None and aggregate < 0):
        raise ValueError("ECC error counts cannot be negative")
    if aggregate is None:
        before = _read_number(state_dir / "ecc-volatile" / uuid)
        aggregate = _read_number(state_dir / "ecc-aggregate" / uuid) + max(0, volatile - before)
    _write_atomic(state_dir / "ecc-aggregate" / uuid, f"{aggregate}\n")
    _write_atomic(state_dir / "ecc-volatile" / uuid, f"{volatile}\n")


def recovery_action(state_dir: Path, uuid: str, action: int) -> None:
    """The driver's recommended recovery (NVML_GPU_RECOVERY_ACTION_*: 0 none, 1 GPU reset, 2 node reboot,
    3 drain P2P, 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot), read through
    nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)."""
    if not 0 <= action <= 7:
        raise ValueError(f"recovery action {action} is not an NVML_GPU_RECOVERY_ACTION_* value (0..7)")
    target = state_dir / "recovery-action" / uuid
    if action == 0:
        target.unlink(missing_ok=True)
    else:
        _write_atomic(target, f"{action}\n")


def unanswering(state_dir: Path, uuid: str, on: bool = True) -> None:
    """A GPU that no longer answers: every call on it and its MIG devices but the identity ones returns
    NVML_ERROR_UNKNOWN. Unlike lose_gpu, no event is delivered."""
    _mark(state_dir, "unanswering", uuid, on)


def find_gpu(state_dir: Path, uuid: str) -> None:
    """A lost GPU is back on the bus: its calls answer again (the other health state is left as it is)."""
    _mark(state_dir, "lost", uuid, False)


def reset_gpu(state_dir: Path, uuid: str) -> None:
    """What a GPU reset does to the state a health check reads, in one call: the GPU is found and answers,
    no retirement or remap is pending, no remap failure, no recovery action, the volatile ECC count is 0.
    The aggregate ECC count survives, as on a real GPU. A process polling the GPU meanwhile sees it answer
    only once the rest is cleared."""
    if (state_dir / "ecc-volatile" / uuid).exists():
        _write_atomic(state_dir / "ecc-volatile" / uuid, "0\n")
    for folder in RESET_CLEARS:
        (state_dir / folder / uuid).unlink(missing_ok=True)


class RunningProcess(Struct, frozen=True):
    """One process NVML lists on a GPU or MIG device (processes/<uuid>, README.md "Running processes")."""

    pid: int
    used_memory: int | None = None  # bytes (usedGpuMemory); None: NVML_VALUE_NOT_AVAILABLE
    sm_util: int | None = None  # percent; None: no utilization sample (nvmlDeviceGetProcessUtilization)
    mem_util: int = 0  # percent
    mps: bool = False  # an MPS client: listed by nvmlDeviceGetMPSComputeRunningProcesses_v3 instead

    def as_json(self) -> dict[str, Any]:
        if self.pid < 1 or self.pid > 0xFFFFFFFF:
            raise ValueError(f"pid {self.pid} is not a process id (1 .. 2^32-1)")
        for name, value in (("sm_util", self.sm_util), ("mem_util", self.mem_util)):
            if value is not None and not 0 <= value <= 100:
                raise ValueError(f"{name} {value} is not a percentage (0 .. 100)")
        if self.used_memory is not None and self.used_memory < 0:
            raise ValueError(f"used_memory {self.used_memory} cannot be negative")
        entry: dict[str, Any] = {"pid": self.pid, "memUtil": self.mem_util, "mps": self.mps}
        if self.used_memory is not None:
            entry["usedGpuMemory"] = self.used_memory
        if self.sm_util is not None:
            entry["smUtil"] = self.sm_util
        return entry


def set_processes(state_dir: Path, uuid: str, processes: list[RunningProcess]) -> None:
    """What NVML lists as running on a GPU or MIG device from now on (an empty list: nothing); every
    process of the node sees it at its next call."""
    target = state_dir / "processes" / uuid
    if not processes:
        target.unlink(missing_ok=True)
        return
    _write_atomic(target, json.dumps([p.as_json() for p in processes]) + "\n")


class MigError(RuntimeError):
    """NVML refused a MIG change; `code` is its NVML return code (23: insufficient resources, ...)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def reboot(state_dir: Path) -> None:
    """What a node reboot does to MIG: every GPU and compute instance is gone (they do not survive one)
    and each GPU is back to the profile's own layout. MIG mode, set with set_mig_mode, persists."""
    folder = state_dir / "mig"
    if not folder.is_dir():
        return
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the library's lock: no change is half made meanwhile
        for layout in folder.glob("GPU-*"):
            layout.unlink(missing_ok=True)


def write_mig_mode(state_dir: Path, uuid: str, on: bool) -> None:
    """MIG mode as `nvidia-smi -mig 1|0` followed by a GPU reset leaves it (current and pending alike)."""
    _write_atomic(state_dir / "mig-mode" / uuid, "1\n" if on else "0\n")


# Fault points for crash tests (README.md, "Fault points"): the NVML calls that change a GPU's state are
# counted per process; fault/kill-after kills the process after the N-th that succeeded, fault/fail-after
# makes the N-th that is called return an NVML error instead.
FAULT_DIR = "fault"


def kill_after(state_dir: Path, n: int, pid: int | None = None) -> None:
    """SIGKILL a process right after its `n`-th NVML call that changed a GPU's state and succeeded (its
    state written); only process `pid` when given, else every process of the node, each counting its own
    calls. Counted from each process's first changing call after this (re-)arming."""
    if n < 1 or (pid is not None and pid < 1):
        raise ValueError(f"kill_after needs n >= 1 and a positive pid, not n={n} pid={pid}")
    _write_atomic(state_dir / FAULT_DIR / "kill-after", f"{n}\n" if pid is None else f"{n} {pid}\n")


def fail_after(state_dir: Path, n: int, code: int, pid: int | None = None) -> None:
    """Make a process's `n`-th NVML call that would change a GPU's state (counted whether it succeeds or
    not) return NVML return code `code` without changing anything; the calls after it run as usual."""
    if n < 1 or code < 1 or (pid is not None and pid < 1):
        raise ValueError(f"fail_after needs n >= 1, an NVML error code >= 1 and a positive pid, "
                         f"not n={n} code={code} pid={pid}")
    text = f"{n} {code}\n" if pid is None else f"{n} {code} {pid}\n"
    _write_atomic(state_dir / FAULT_DIR / "fail-after", text)


def clear_faults(state_dir: Path) -> None:
    """Disarm kill_after and fail_after."""
    for name in ("kill-after", "fail-after"):
        (state_dir / FAULT_DIR / name).unlink(missing_ok=True)


def read_compute_mode(state_dir: Path, uuid: str, default: str = "DEFAULT") -> str:
    try:
        return (state_dir / "compute-mode" / uuid).read_text().strip() or default
    except FileNotFoundError:
        return default


def write_sysfs(inventory: Inventory, root: Path) -> Path:
    """The part of /sys the plugin reads: each GPU's PCI device with its numa_node (sim/nvml/sysfs.py)."""
    from sim.nvml.sysfs import write_sysfs_tree

    return write_sysfs_tree(({"pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node, "pcie_root": g.pcie_root}
                             for g in inventory.gpus), root)


class NodeSim:
    """A simulated node: a profile plus a state directory, and the environment that points NVML at them."""

    def __init__(self, profile: str | Path, state_dir: Path) -> None:
        self.profile = resolve_profile(profile)
        self.inventory: Inventory = load_profile(self.profile)
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.library = build_library()
        self.profile_json = profile_as_json(self.profile, self.state_dir / "profile.json")
        self.sysfs = write_sysfs(self.inventory, self.state_dir / "sys")

    def __enter__(self) -> NodeSim:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    @property
    def env(self) -> dict[str, str]:
        """Variables to add to a subprocess's environment so its pynvml loads the stand-in for this node."""
        ld_path = os.environ.get("LD_LIBRARY_PATH", "")
        return {
            "LD_LIBRARY_PATH": f"{self.library.parent}:{ld_path}" if ld_path else str(self.library.parent),
            "NVML_SIM_PROFILE": str(self.profile_json),
            "NVML_SIM_STATE_DIR": str(self.state_dir),
            "NVML_SIM_PYTHON": sys.executable,
            "NVDP_SYSFS_ROOT": str(self.sysfs),
        }

    def _known(self, uuid: str) -> None:
        for gpu in self.inventory.gpus:
            if uuid == gpu.uuid or any(m.uuid == uuid for m in gpu.mig_devices):
                return
        for gpu in self.inventory.gpus:  # a MIG device made while the node runs
            if gpu.mig_capable and any(m["uuid"] == uuid for m in self.mig_instances(gpu.uuid)):
                return
        raise ValueError(f"{uuid} is not a GPU or MIG device of node profile {self.profile.name}")

    def inject_xid(self, uuid: str, xid: int) -> None:
        self._known(uuid)
        inject_xid(self.state_dir, uuid, xid)

    def lose_gpu(self, uuid: str) -> None:
        self._known(uuid)
        if self.inventory.gpu(uuid) is None:
            raise ValueError(f"{uuid} is a MIG device; only a whole GPU can fall off the bus")
        lose_gpu(self.state_dir, uuid)

    def _whole_gpu(self, uuid: str, call: str) -> None:
        self._known(uuid)
        if self.inventory.gpu(uuid) is None:
            raise ValueError(f"{uuid} is a MIG device; {call} takes a GPU's UUID (its MIG devices follow it)")

    def pending_retirement(self, uuid: str, on: bool = True) -> None:
        self._whole_gpu(uuid, "pending_retirement")
        pending_retirement(self.state_dir, uuid, on)

    def pending_remap(self, uuid: str, on: bool = True) -> None:
        self._whole_gpu(uuid, "pending_remap")
        pending_remap(self.state_dir, uuid, on)

    def remap_failure(self, uuid: str, on: bool = True) -> None:
        self._whole_gpu(uuid, "remap_failure")
        remap_failure(self.state_dir, uuid, on)

    def ecc_errors(self, uuid: str, volatile: int, aggregate: int | None = None) -> None:
        self._whole_gpu(uuid, "ecc_errors")
        ecc_errors(self.state_dir, uuid, volatile, aggregate)

    def recovery_action(self, uuid: str, action: int) -> None:
        self._whole_gpu(uuid, "recovery_action")
        recovery_action(self.state_dir, uuid, action)

    def unanswering(self, uuid: str, on: bool = True) -> None:
        self._whole_gpu(uuid, "unanswering")
        unanswering(self.state_dir, uuid, on)

    def find_gpu(self, uuid: str) -> None:
        self._whole_gpu(uuid, "find_gpu")
        find_gpu(self.state_dir, uuid)

    def reset_gpu(self, uuid: str) -> None:
        self._whole_gpu(uuid, "reset_gpu")
        reset_gpu(self.state_dir, uuid)

    def set_processes(self, uuid: str, processes: list[RunningProcess]) -> None:
        """The processes NVML lists on a GPU or MIG device of the node (set_processes above)."""
        self._known(uuid)
        set_processes(self.state_dir, uuid, processes)

    def compute_mode(self, uuid: str) -> str:
        """The compute mode last set through NVML by any process ("DEFAULT", "EXCLUSIVE_PROCESS", ...)."""
        self._known(uuid)
        return read_compute_mode(self.state_dir, uuid)

    # MIG instances, changed through the library in a process of their own (sim/nvml/mig.py), as an
    # admin's `nvidia-smi mig` changes them behind a plugin's back.

    def _mig(self, *args: str) -> Any:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
        env.update(self.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        done = subprocess.run([sys.executable, "-m", "sim.nvml.mig", *args], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=60, check=False)
        try:
            answer = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise MigError(f"sim.nvml.mig {' '.join(args)} failed: {done.stderr.strip()[-2000:]}") from None
        if "error" in answer:
            raise MigError(f"NVML refused {args[0]} on {args[2]}: {answer['error']}", answer.get("code"))
        return answer["result"]

    def _mig_gpu(self, uuid: str) -> None:
        gpu = self.inventory.gpu(uuid)
        if gpu is None or not gpu.mig_capable:
            raise ValueError(f"{uuid} is not a MIG-capable GPU of node profile {self.profile.name}")

    def mig_create(self, gpu_uuid: str, gi_profile_id: int, start: int) -> str:
        """A GPU instance of the GI profile at memory slice `start` plus a compute instance spanning it
        (`nvidia-smi mig -cgi ID -C`); returns the new MIG device's UUID. MigError: NVML refused it."""
        self._mig_gpu(gpu_uuid)
        args = ("--gi-profile", str(gi_profile_id), "--start", str(start))
        return str(self._mig("create", "--uuid", gpu_uuid, *args))

    def mig_destroy(self, gpu_uuid: str, gi_id: int) -> None:
        """The GPU instance and its compute instances (`nvidia-smi mig -dci -gi ID; mig -dgi -gi ID`)."""
        self._mig_gpu(gpu_uuid)
        self._mig("destroy", "--uuid", gpu_uuid, "--gi-id", str(gi_id))

    def mig_instances(self, gpu_uuid: str) -> list[dict[str, Any]]:
        """The GPU's MIG devices and bare GPU instances: dicts of gi_id, ci_id, gi_profile_id, start, size,
        uuid, profile (ci_id and uuid None for a GPU instance without a compute instance)."""
        self._mig_gpu(gpu_uuid)
        found: list[dict[str, Any]] = self._mig("list", "--uuid", gpu_uuid)
        return found

    def gpu_instances(self, gpu_uuid: str) -> list[dict[str, Any]]:
        """Every GPU instance of the GPU, also one a crash left without a compute instance, as NVML lists
        them (nvmlDeviceGetGpuInstances per GI profile): dicts of gi_id, gi_profile_id, profile, start,
        size, ci_ids (the ids of its compute instances; [] for none), by GI id. [] with MIG mode off."""
        self._mig_gpu(gpu_uuid)
        found: list[dict[str, Any]] = self._mig("gis", "--uuid", gpu_uuid)
        return found

    # Fault points for crash tests (kill_after above): armed through the state directory, so they reach
    # processes already running and the processes they start.

    def kill_after(self, n: int, pid: int | None = None) -> None:
        """SIGKILL a process right after its `n`-th successful NVML call that changed a GPU's state
        (creating or destroying a GPU or compute instance, setting MIG or compute mode); only `pid` when
        given. Arming it again restarts the count."""
        kill_after(self.state_dir, n, pid)

    def fail_after(self, n: int, code: int, pid: int | None = None) -> None:
        """The `n`-th NVML call of a process that would change a GPU's state returns `code` and changes
        nothing (calls are counted whether they succeed or not); only `pid`'s when given."""
        fail_after(self.state_dir, n, code, pid)

    def clear_faults(self) -> None:
        clear_faults(self.state_dir)

    def set_mig_mode(self, gpu_uuid: str, on: bool) -> None:
        """An admin's `nvidia-smi -mig 1|0` and GPU reset (stand-in only): refused while instances exist."""
        self._mig_gpu(gpu_uuid)
        existing = self.mig_instances(gpu_uuid)
        if existing:
            raise MigError(
                f"{gpu_uuid} has {len(existing)} MIG instance(s); destroy them before changing MIG mode"
            )
        write_mig_mode(self.state_dir, gpu_uuid, on)

    def reboot(self) -> None:
        """Every dynamic MIG instance is gone and the profile's static layout is back (reboot above)."""
        reboot(self.state_dir)
