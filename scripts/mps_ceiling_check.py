"""The MPS ceilings nvdp's daemons set, checked on a real GPU by CUDA clients that allocate past their
claim and read the SMs MPS gives them (the driver API through ctypes: no compiler, no CUDA toolkit).

  dra            nvdp's DRA MPS daemon (nvdp.dra.claims.sharing.mps.ClaimMps) on GPU 0 for claim A (25%, 8
  GiB): a
                 client with A's environment, and one whose environment asks for the whole GPU; claim B
                 (50%, 16 GiB) joins, raising the running server's ceiling: B's client, A's, the greedy
                 one; B leaves, lowering it again
  device plugin  nvdp's device-plugin MPS daemon with 4 replicas: a client asking for the whole GPU

Compute modes are left as they are (the daemons get no-op compute modes) and every daemon is quit at
the end. Needs the driver's nvidia-cuda-mps-control on PATH, Python with msgspec, and no Kubernetes.
`--sim` plays the clients on the stand-in nvidia-cuda-mps-control instead (no GPU needed).

    python3 scripts/mps_ceiling_check.py OUT_DIR [--sim]
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]
SIM = "--sim" in sys.argv
MIB = 1024 * 1024
report: dict[str, Any] = {"steps": []}
LOG = logging.getLogger("mps-ceiling-check")

PROBE = r'''
import ctypes, json, sys
cu = ctypes.CDLL("libcuda.so.1")
out = {}
def name(r):
    s = ctypes.c_char_p(); cu.cuGetErrorName(r, ctypes.byref(s))
    return s.value.decode() if s.value else str(r)
def ck(r, what):
    if r != 0:
        out["error"] = f"{what}: {name(r)}"; print(json.dumps(out)); sys.exit(0)
ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
sms = ctypes.c_int(); cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev); out["sm_attribute"] = sms.value
aff = (ctypes.c_int * 2)(); r = cu.cuCtxGetExecAffinity(aff, 0)
out["sm_affinity"] = aff[1] if r == 0 else name(r)
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["mem_info_mib"] = [free.value >> 20, total.value >> 20]
allocs = {}
for mib in map(int, sys.argv[1:]):
    ptr = ctypes.c_uint64(); r = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
    allocs[str(mib)] = "ok" if r == 0 else name(r)
    if r == 0: cu.cuMemFree_v2(ptr)
out["alloc"] = allocs
print(json.dumps(out))
'''


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}


def probe(what: str, pipe: str, client: dict[str, str], sizes: list[int]) -> None:
    started = time.monotonic()
    try:
        if SIM:
            from sim.mps import connect_client
            answer: Any = connect_client(Path(pipe), client)
        else:
            env = {**base_env(), **client, "CUDA_MPS_PIPE_DIRECTORY": pipe}
            done = subprocess.run([sys.executable, "-c", PROBE, *map(str, sizes)], env=env,
                                  capture_output=True, text=True, timeout=90, check=False)
            answer = json.loads(done.stdout) if done.stdout.strip() else {"exit": done.returncode,
                                                                            "stderr": done.stderr[-800:]}
    except Exception as err:  # one step's failure is its report line
        answer = {"exception": f"{type(err).__name__}: {err}"}
    step = {"step": what, "client_env": {k: v for k, v in client.items() if k != "CUDA_MPS_PIPE_DIRECTORY"},
            "took_s": round(time.monotonic() - started, 1), "answer": answer}
    report["steps"].append(step)
    print(json.dumps(step), flush=True)


def control(pipe: str, command: str) -> str:
    env = {**base_env(), "CUDA_MPS_PIPE_DIRECTORY": pipe}
    done = subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", env=env, capture_output=True,
                          text=True, timeout=20, check=False)
    return f"exit {done.returncode}: {done.stdout.strip()} {done.stderr.strip()}".strip()


class NoModes:
    """Compute modes stay as they are on this machine."""

    def set_exclusive(self, uuids: Any) -> None:
        pass

    def restore(self, uuids: Any) -> None:
        pass

    def close(self) -> None:
        pass


def gpu_inventory() -> Any:
    from nvdp.inventory.model import Gpu, Inventory

    if SIM:
        from tests.mps.nodes import gpu, inventory
        return inventory(gpu(0, "NVIDIA H100 80GB HBM3", 81559, (9, 0)))
    line = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,compute_cap,pci.bus_id",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]
    index, uuid, name, memory, cap, bus = [x.strip() for x in line.split(",")]
    major, minor = cap.split(".")
    return Inventory(driver_version="", cuda_driver_version="", gpus=(Gpu(
        index=int(index), uuid=uuid, name=name, memory_bytes=int(memory) * MIB,
        compute_capability=(int(major), int(minor)), minor=int(index), pci_bus_id=bus),))


def dra(inv: Any, root: Path) -> None:
    from nvdp.daemon.report.recording import Recorder
    from nvdp.dra.claims.sharing.mps import ClaimMps, claim_limits, client_env
    from nvdp.mps.ordered.daemons import OrderedDaemons

    uuid = inv.gpus[0].uuid
    claims = ClaimMps(root=root, host_root=str(root), driver="gpu.nvidia.com", inventory=inv, log=LOG,
                      ready_wait_s=30)
    # The MPS image's side, in this process: the orders carried out as the dra-mps DaemonSet does.
    ordered = OrderedDaemons(root, "gpu.nvidia.com", NoModes, LOG, 5.0, recorder=Recorder())
    done = threading.Event()

    def carry_out() -> None:
        while not done.wait(0.05):
            ordered.reconcile()

    runner = threading.Thread(target=carry_out, daemon=True)
    runner.start()
    greedy = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80000M"}
    try:
        pipe = claims.use("A", [uuid], claim_limits(25, [(uuid, 8192)])).pipe_dir
        env_a = {k: v for k, v in client_env(25, [8192]).items() if k != "CUDA_MPS_PIPE_DIRECTORY"}
        probe("dra: claim A (25%, 8192 MiB) alone, A's env", pipe, env_a, [4096, 12288])
        probe("dra: claim A alone, env rewritten to the whole GPU", pipe, greedy, [4096, 12288])
        report["server_list_a"] = control(pipe, "get_server_list")
        try:
            claims.use("B", [uuid], claim_limits(50, [(uuid, 16384)]))
            report["raise"] = "ok"
        except Exception as err:
            report["raise"] = f"{type(err).__name__}: {err}"
        settings = claims.settings([uuid])
        report["ceiling_after_b"] = str(settings.ceiling if settings else None)
        env_b = {k: v for k, v in client_env(50, [16384]).items() if k != "CUDA_MPS_PIPE_DIRECTORY"}
        probe("dra: A and B (50%, 16384 MiB), B's env", pipe, env_b, [12288, 20480])
        probe("dra: A and B, A's env", pipe, env_a, [12288])
        probe("dra: A and B, env rewritten to the whole GPU", pipe, greedy, [12288, 20480])
        report["server_list_ab"] = control(pipe, "get_server_list")
        claims.release("B")
        time.sleep(1.0)  # the lowered order, carried out at the next pass
        probe("dra: B released, env rewritten to the whole GPU", pipe, greedy, [4096, 12288])
    finally:
        done.set()
        runner.join()
        report["dra_stop_restored"] = ordered.stop()


def device_plugin(inv: Any, root: Path) -> None:
    from nvdp.daemon.report.recording import Recorder
    from nvdp.mps.daemons import plan_mps
    from nvdp.mps.paths import ResourcePaths
    from nvdp.mps.supervisor import ResourceDaemon
    from tests.mps.nodes import mps_config

    (settings,) = plan_mps(mps_config(4), inv)
    report["device_plugin_commands"] = list(settings.commands)
    daemon = ResourceDaemon(settings, ResourcePaths(root, "nvidia.com/gpu"), NoModes(), LOG,
                            recorder=Recorder())
    daemon.start()
    try:
        deadline = time.monotonic() + 30
        while not daemon.paths.ready_marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        share = inv.gpus[0].memory_bytes // 4 // MIB
        greedy = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80000M"}
        probe(f"device plugin: 4 replicas, env asking the whole GPU (share {share} MiB)",
              str(daemon.paths.pipe_dir), greedy, [share - 2048, share + 2048])
    finally:
        report["dp_stop_restored"] = daemon.stop()


def main() -> None:
    """Each stage reported on its own; the report also goes to OUT_DIR/report.json."""
    args = [a for a in sys.argv[1:] if a != "--sim"]
    if len(args) != 1:
        raise SystemExit(__doc__)
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=str(out / "nvdp.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    import shutil

    if SIM:
        from sim.mps import BIN_DIR
        os.environ["PATH"] = f"{BIN_DIR}:{os.environ['PATH']}"
    report["mps_control"] = shutil.which("nvidia-cuda-mps-control")
    report["smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_mode,memory.total",
                                    "--format=csv,noheader"], capture_output=True, text=True,
                                   check=False).stdout.strip() if not SIM else "sim"
    inv = gpu_inventory()
    report["gpu"] = [inv.gpus[0].uuid, inv.gpus[0].name, inv.gpus[0].memory_bytes // MIB]
    if not SIM:
        probe("no MPS", "/nonexistent-mps-pipe", {}, [4096])
    roots = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # unix socket paths are short
    report["roots"] = str(roots)
    for stage in (dra, device_plugin):
        try:
            stage(inv, roots / stage.__name__)
        except Exception:
            report[f"{stage.__name__}_error"] = traceback.format_exc()[-2000:]
    for log in roots.glob("*/*/*/log/*.log"):  # the daemons' and servers' own logs, kept in OUT_DIR
        shutil.copy(log, out / f"{log.parents[3].name}-{log.name}")
    shutil.rmtree(roots, ignore_errors=True)
    if not SIM:
        report["smi_after"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"], capture_output=True,
            text=True, check=False).stdout.strip()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "steps"}, indent=1))


if __name__ == "__main__":
    main()
