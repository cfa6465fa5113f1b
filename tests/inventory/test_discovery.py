"""Discovery with the real pynvml against the stand-in NVML, in subprocesses so LD_LIBRARY_PATH applies."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdp.inventory import model
from nvdp.inventory.profile import load_profile
from sim.nvml import NodeSim, list_profiles

pytestmark = pytest.mark.slow  # starts processes

RunPy = Callable[..., subprocess.CompletedProcess[str]]

DISCOVER = """
import sys
from nvdp.inventory.nvml import NvmlUnavailable, discover
try:
    print(repr(discover(container_driver_root=sys.argv[1] if len(sys.argv) > 1 else "/driver-root")))
except NvmlUnavailable as e:
    print(f"UNAVAILABLE {e.code} {e}")
"""


def parse(stdout: str) -> model.Inventory:
    kinds = ("Inventory", "Gpu", "MigDevice", "MigAttributes", "MigProfile", "Link", "LostGpu", "Fabric")
    names = {k: getattr(model, k) for k in kinds}
    value = eval(stdout, {"__builtins__": {}}, names)  # the child printed the records' reprs
    assert isinstance(value, model.Inventory)
    return value


@pytest.mark.parametrize("profile", list_profiles())
def test_discovery_matches_profile(profile: str, make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node(profile)
    result = run_py(DISCOVER, node.env)
    assert result.returncode == 0, result.stderr
    assert parse(result.stdout) == node.inventory


@pytest.mark.parametrize(
    ("fail", "code", "text"),
    [
        ("driver_not_loaded", 9, "the NVIDIA kernel driver is not loaded on this node. Fix: install"),
        ("lib_rm_version_mismatch", 18, "does not match the loaded kernel module, which happens"),
        ("no_permission", 4, "insufficient permissions to open the NVIDIA device nodes"),
    ],
)
def test_init_failures_are_explained(
    fail: str, code: int, text: str, make_node: Callable[[str], NodeSim], run_py: RunPy
) -> None:
    node = make_node("t4")
    result = run_py(DISCOVER, {**node.env, "NVML_SIM_FAIL_INIT": fail})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"UNAVAILABLE {code} NVML is not available (ERROR_")
    assert text in result.stdout


def test_node_env_points_at_a_json_copy_of_the_profile(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("a100-sxm-8")
    assert node.env["NVML_SIM_PROFILE"] == str(node.state_dir / "profile.json")
    assert load_profile(node.env["NVML_SIM_PROFILE"]) == node.inventory


def test_library_still_reads_a_yaml_profile(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("mixed-4")
    result = run_py(DISCOVER, {**node.env, "NVML_SIM_PROFILE": str(node.profile)})
    assert result.returncode == 0, result.stderr
    assert parse(result.stdout) == node.inventory


def test_no_profile_means_driver_not_loaded(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    env = dict(make_node("t4").env)
    del env["NVML_SIM_PROFILE"]
    result = run_py(DISCOVER, env)
    assert result.stdout.startswith("UNAVAILABLE 9 NVML is not available (ERROR_DRIVER_NOT_LOADED)")


def test_library_not_found_points_at_the_runtime(tmp_path: Path, run_py: RunPy) -> None:
    result = run_py(DISCOVER, {}, str(tmp_path))
    out = result.stdout
    assert out.startswith("UNAVAILABLE 12 NVML is not available (ERROR_LIBRARY_NOT_FOUND): libnvidia-ml.so.1")
    assert f"{tmp_path}/usr/lib64/libnvidia-ml.so.1, {tmp_path}/usr/lib/x86_64-linux-gnu/" in out
    assert "the container runtime did not inject the NVIDIA driver" in out
    assert "(`runtimeClassName: nvidia`, chart value runtimeClassName)" in out
    assert "make `nvidia` the default runtime of containerd/docker" in out
    assert "deploy the plugin only to GPU nodes (nodeSelector or node affinity)" in out


def test_library_found_under_driver_root(
    tmp_path: Path, make_node: Callable[[str], NodeSim], run_py: RunPy
) -> None:
    node = make_node("mixed-4")
    root = tmp_path / "driver-root"
    lib_dir = root / "usr/lib/x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    shutil.copy(node.library, lib_dir / "libnvidia-ml.so.535.161.08")
    # As on a host: an absolute link, which must resolve inside the mounted root.
    (lib_dir / "libnvidia-ml.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.161.08")
    env = {k: v for k, v in node.env.items() if k != "LD_LIBRARY_PATH"}
    result = run_py(DISCOVER, env, str(root))
    assert result.returncode == 0, result.stderr
    assert parse(result.stdout) == node.inventory


def test_gpu_lost_at_startup_is_left_out(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("a100-sxm-8")
    lost = node.inventory.gpus[2]
    node.lose_gpu(lost.uuid)
    inventory = parse(run_py(DISCOVER, node.env).stdout)
    assert [g.index for g in inventory.gpus] == [0, 1, 3, 4, 5, 6, 7]
    assert inventory.lost == (
        model.LostGpu(
            index=2,
            uuid=lost.uuid,
            reason="GPU is lost (ERROR_GPU_IS_LOST): it fell off the bus or stopped responding; look for "
            "Xid 79 in the kernel log, then reset the GPU or reboot the node",
        ),
    )
    assert all(2 not in (lk.a, lk.b) for lk in inventory.links)
    assert inventory.link(1, 3) == node.inventory.link(1, 3)
    assert inventory.gpus[0] == node.inventory.gpus[0]


NUMA = """
import sys
from nvdp.inventory.nvml import discover
print([g.numa_node for g in discover().gpus])
"""


def test_numa_comes_from_sysfs_not_nvml(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    """On GH200/GB200 NVML names the GPU memory's own NUMA node; the kubelet needs the CPU node that
    sysfs reports for the PCI device, which is what NVIDIA's plugin reads."""
    node = make_node("a100-sxm-8")  # the stand-in NVML answers 0,0,0,0,1,1,1,1
    for gpu in node.inventory.gpus:
        domain, _, rest = gpu.pci_bus_id.partition(":")
        numa = -1 if gpu.index == 0 else gpu.index % 2 + 2  # -1: the kernel knows no node
        device = node.sysfs / "bus/pci/devices" / f"{domain[-4:]}:{rest}".lower()
        (device / "numa_node").write_text(f"{numa}\n")
    result = run_py(NUMA, node.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[None, 3, 2, 3, 2, 3, 2, 3]"


def test_a_corrupt_library_is_not_reported_as_missing(tmp_path: Path, run_py: RunPy) -> None:
    library = tmp_path / "usr/lib64/libnvidia-ml.so.1"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF this is not a library")
    result = run_py(DISCOVER, {}, str(tmp_path))
    out = result.stdout
    expected = f"UNAVAILABLE None NVML is not available: {library} was found but cannot be loaded ("
    assert out.startswith(expected), out
    assert "damaged, truncated or built for another architecture" in out
    assert "not found" not in out and "Traceback" not in result.stderr
