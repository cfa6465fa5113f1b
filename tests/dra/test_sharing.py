"""Sharing in DRA mode: devices named and replicated by the node's plan, their slices, a claim's share
(MPS client limits, intervals), and the MPS daemons that claims on one GPU share."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.config.model import Config, Flags, ReplicatedResource, ReplicatedResources, Sharing
from nvdp.dra.claims.check import ClaimProblem
from nvdp.dra.claims.sharing.gpuconfig import DeviceSharing, MpsLimits, SharingProblem
from nvdp.dra.claims.sharing.mps import ClaimMps, MpsUnavailable, daemon_name
from nvdp.dra.claims.sharing.mps_limits import (
    ClaimLimits,
    DaemonLimits,
    Enforcement,
    daemon_ceiling,
    enforcement,
    read_limits,
    write_limits,
)
from nvdp.dra.claims.sharing.node import (
    ClaimShare,
    NodeSharing,
    capacity_limits,
    claim_share,
    consumed_capacity,
    node_default,
)
from nvdp.dra.claims.sharing.timeslice import TimesliceError, set_timeslice
from nvdp.dra.pool.devices import DraDevice, dra_devices, with_plan
from nvdp.dra.pool.slices import desired_slices, slice_content
from nvdp.inventory.profile import load_profile
from nvdp.mps.commands import Ceiling, MpsGpu, MpsSettings
from nvdp.plan import plan
from sim.nvml import resolve_profile
from tests.mps.fakes import FakeModes
from tests.mps.nodes import gpu, inventory
from tests.mps.ordered_runner import carried_out
from tests.mps.waiting import wait_for

MIB = 1024 * 1024
LOG = logging.getLogger("test-dra-sharing")
T4 = load_profile(resolve_profile("t4"))


def shared_config(kind: str = "timeSlicing", replicas: int = 10, rename: bool = False) -> Config:
    entry = ReplicatedResource(name="nvidia.com/gpu", replicas=replicas,
                               rename="nvidia.com/gpu.shared" if rename else None)
    resources = ReplicatedResources(resources=(entry,))
    sharing = Sharing(time_slicing=resources) if kind == "timeSlicing" else Sharing(mps=resources)
    return Config(flags=Flags(), sharing=sharing, source="test")


def published_devices(*devices: DraDevice) -> list[dict[str, object]]:
    (only,) = desired_slices(node="n", node_uid="", driver="gpu.nvidia.com", devices=devices)
    return list(only["spec"]["devices"])


REPLICAS_10 = {"value": "10", "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}}}


def t4_devices(config: Config) -> tuple[DraDevice, ...]:
    return with_plan(dra_devices(T4), plan(config, T4))


# --- devices and slices -------------------------------------------------------------------------------


def test_an_unshared_gpu_is_published_once_under_its_resource_name() -> None:
    (device,) = t4_devices(Config(source="test"))
    assert device.attributes["resource"] == {"string": "nvidia.com/gpu"}
    assert (device.replicas, device.sharing, device.shared) == (1, "none", False)
    (published,) = published_devices(device)
    assert "allowMultipleAllocations" not in published
    assert published["capacity"] == {"memory": {"value": str(15360 * MIB)}}


@pytest.mark.parametrize(("kind", "rename", "resource", "sharing"), [
    ("timeSlicing", False, "nvidia.com/gpu", "time-slicing"),
    ("mps", False, "nvidia.com/gpu", "mps"),
    ("timeSlicing", True, "nvidia.com/gpu.shared", "time-slicing"),
])
def test_a_shared_gpu_takes_up_to_replicas_claims(kind: str, rename: bool, resource: str,
                                                  sharing: str) -> None:
    (device,) = t4_devices(shared_config(kind, 10, rename))
    assert device.attributes["resource"] == {"string": resource}
    assert (device.replicas, device.sharing) == (10, sharing)
    (published,) = published_devices(device)
    assert published["allowMultipleAllocations"] is True
    assert published["capacity"] == {
        # each claim takes one replica and a tenth of the memory unless it asks for more
        "memory": {"value": str(15360 * MIB), "requestPolicy": {"default": str(1536 * MIB)}},
        "replicas": REPLICAS_10,
    }


def test_a_shared_slice_compares_equal_to_the_api_servers_rewrite() -> None:
    (device,) = t4_devices(shared_config())
    (desired,) = desired_slices(node="n", node_uid="", driver="gpu.nvidia.com", devices=[device])
    listed = {"spec": {**desired["spec"], "pool": {**desired["spec"]["pool"], "generation": 7}}}
    (entry,) = listed["spec"]["devices"]
    entry = {**entry, "capacity": {
        "memory": {"value": "15Gi", "requestPolicy": {"default": "1536Mi"}},
        "replicas": REPLICAS_10,
    }}
    listed["spec"]["devices"] = [entry]
    assert slice_content(listed) == slice_content(desired)
    other = replace(device, replicas=4)
    (fewer,) = desired_slices(node="n", node_uid="", driver="gpu.nvidia.com", devices=[other])
    assert slice_content(fewer) != slice_content(desired)


def test_mig_devices_are_named_after_their_profile_resource() -> None:
    node = load_profile(resolve_profile("h100-mig-8"))
    config = Config(flags=Flags(mig_strategy="mixed"), source="test")
    devices = with_plan(dra_devices(node), plan(config, node))
    names = {str(d.attributes["resource"]["string"]) for d in devices if d.kind == "mig"}
    assert names and all(n.startswith("nvidia.com/mig-") for n in names)
    for d in devices:
        if d.kind == "mig":
            profile = str(d.attributes["profile"]["string"])
            assert d.attributes["resource"]["string"] == f"nvidia.com/mig-{profile.replace('+', '.')}"
    # migStrategy none advertises the GPUs whole; their MIG devices keep NVIDIA's mixed names
    whole = with_plan(dra_devices(node), plan(Config(source="test"), node))
    assert {d.attributes["resource"]["string"] for d in whole} == names | (
        {"nvidia.com/gpu"} if any(d.kind == "gpu" for d in whole) else set())


# --- a claim's share ------------------------------------------------------------------------------------


def dev(name: str, uuid: str, kind: str = "gpu", memory_mib: int = 15360) -> DraDevice:
    return DraDevice(name=name, kind=kind, uuid=uuid, gpu_uuid=uuid, attributes={},
                     capacity={"memory": {"value": str(memory_mib * MIB)}})


def mps(threads: int | None, mib: int | None) -> DeviceSharing:
    return DeviceSharing(strategy="MPS", mps=MpsLimits(active_thread_percentage=threads,
                                                       pinned_memory_limit_mib=mib))


def test_an_mps_claim_gets_the_pipe_and_its_limits_per_device() -> None:
    a, b = dev("gpu-0", "GPU-A"), dev("gpu-1", "GPU-B")
    share = claim_share([a, b], {"gpu-0": mps(25, 4096), "gpu-1": mps(50, None)})
    assert share.mps_gpus == ("GPU-A", "GPU-B")
    assert share.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M")


def test_a_claim_mixing_mps_and_plain_devices_is_refused() -> None:
    a, b = dev("gpu-0", "GPU-A"), dev("gpu-1", "GPU-B")
    with pytest.raises(SharingProblem, match="gpu-0 are shared through MPS but gpu-1 are not"):
        claim_share([a, b], {"gpu-0": mps(25, None)})


def test_time_slicing_sets_the_interval_of_full_gpus_only() -> None:
    a, m = dev("gpu-0", "GPU-A"), dev("gpu-1-mig-1g10gb-19-0", "MIG-1", kind="mig")
    share = claim_share([a, m], {"gpu-0": DeviceSharing(strategy="TimeSlicing", interval="Long"),
                                 "gpu-1-mig-1g10gb-19-0": DeviceSharing(strategy="TimeSlicing")})
    assert share == ClaimShare(timeslices=(("GPU-A", "Long"),))
    assert claim_share([a], {}) == ClaimShare()


def test_the_nodes_mps_replicas_split_threads_and_memory() -> None:
    (device,) = t4_devices(shared_config("mps", 10))
    assert node_default(device) == DeviceSharing(
        strategy="MPS", source="node config (sharing.mps)",
        mps=MpsLimits(active_thread_percentage=10, pinned_memory_limit_mib=1536))
    (sliced,) = t4_devices(shared_config("timeSlicing", 4))
    assert node_default(sliced).strategy == "TimeSlicing" and node_default(sliced).interval is None
    (plain,) = t4_devices(Config(source="test"))
    assert node_default(plain) == DeviceSharing()


def test_set_timeslice_runs_nvidia_smi_and_reports_its_failure() -> None:
    calls: list[list[str]] = []

    class Done:
        def __init__(self, code: int, err: str = "") -> None:
            self.returncode, self.stdout, self.stderr = code, "", err

    def run(args: object) -> Done:
        calls.append(list(args))  # type: ignore[call-overload]
        return Done(0)

    set_timeslice("GPU-A", "Medium", run)  # type: ignore[arg-type]
    assert calls == [["nvidia-smi", "compute-policy", "-i", "GPU-A", "--set-timeslice", "2"]]
    with pytest.raises(TimesliceError, match="failed \\(exit 3\\): Insufficient Permissions"):
        set_timeslice("GPU-A", "Long", lambda _: Done(3, "Insufficient Permissions"))  # type: ignore[arg-type,return-value]
    with pytest.raises(TimesliceError, match="unknown time-slice interval 'Fast'"):
        set_timeslice("GPU-A", "Fast", run)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_stand_in_nvidia_smi_records_the_interval(tmp_path: Path) -> None:
    import json
    import os
    import subprocess

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"gpus": [{"uuid": "GPU-A", "name": "Tesla T4"}]}))
    env = {**os.environ, "NVML_SIM_PROFILE": str(profile), "NVML_SIM_STATE_DIR": str(tmp_path / "state")}
    smi = str(Path(__file__).resolve().parents[2] / "sim" / "nvidia-smi")
    done = subprocess.run([smi, "compute-policy", "-i", "GPU-A", "--set-timeslice", "3"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "state" / "timeslice" / "GPU-A").read_text() == "3\n"
    unknown = subprocess.run([smi, "compute-policy", "-i", "GPU-B", "--set-timeslice", "3"], env=env,
                             capture_output=True, text=True, check=False)
    assert unknown.returncode == 6


# --- MPS daemons shared by claims -----------------------------------------------------------------------


@pytest.fixture
def mps_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # unix socket paths are short
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def claim_mps(mps_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ClaimMps, FakeModes]]:
    from sim.mps import BIN_DIR, RECORD_ENV

    monkeypatch.setenv("PATH", f"{BIN_DIR}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv(RECORD_ENV, str(mps_root / "record.jsonl"))
    modes = FakeModes()
    manager = ClaimMps(root=mps_root, host_root="/run/nvidia/mps", driver="gpu.nvidia.com",
                       inventory=inventory(gpu(0), gpu(1)), log=LOG, ready_wait_s=10, poll_s=0.01)
    with carried_out(mps_root, lambda: modes):
        yield manager, modes


@pytest.mark.slow
def test_claims_on_one_gpu_share_its_daemon_until_the_last_is_gone(claim_mps: tuple[ClaimMps, FakeModes],
                                                                   mps_root: Path) -> None:
    manager, modes = claim_mps
    g0 = gpu(0).uuid
    first = manager.use("claim-1", [g0])
    second = manager.use("claim-2", [g0])
    assert first == second
    assert first.pipe_dir == f"/run/nvidia/mps/gpu.nvidia.com/{g0}/pipe"
    assert first.shm_dir == "/run/nvidia/mps/gpu.nvidia.com/shm"
    assert (mps_root / "gpu.nvidia.com" / g0 / ".ready").exists()
    assert modes.calls == [("EXCLUSIVE_PROCESS", [g0])]
    manager.release("claim-1")
    assert (mps_root / "gpu.nvidia.com" / g0 / ".ready").exists()
    manager.release("claim-2")  # the order is withdrawn; the MPS image stops the daemon shortly after
    assert wait_for(lambda: not (mps_root / "gpu.nvidia.com" / g0 / ".ready").exists())
    assert wait_for(lambda: ("DEFAULT", [g0]) in modes.calls)
    assert manager.users() == {}


@pytest.mark.slow
def test_a_claim_on_another_gpu_set_overlapping_a_running_daemon_is_refused(
        claim_mps: tuple[ClaimMps, FakeModes]) -> None:
    manager, _ = claim_mps
    g0, g1 = gpu(0).uuid, gpu(1).uuid
    manager.use("claim-1", [g0])
    with pytest.raises(MpsUnavailable, match="one GPU serves one MPS daemon"):
        manager.use("claim-2", [g0, g1])
    pair = manager.use("claim-3", [g1])
    assert pair.pipe_dir.endswith(f"/{g1}/pipe")
    assert set(manager.users()) == {(g0,), (g1,)}


@pytest.mark.slow
def test_a_daemon_that_does_not_answer_fails_the_prepare_with_its_error(
        claim_mps: tuple[ClaimMps, FakeModes], monkeypatch: pytest.MonkeyPatch) -> None:
    manager, modes = claim_mps
    monkeypatch.setenv("PATH", "/nonexistent")
    manager.ready_wait_s = 1.0
    with pytest.raises(MpsUnavailable, match=r"not ready after 1s: MPS control daemon did not start: "
                                             r"nvidia-cuda-mps-control is not on PATH"):
        manager.use("claim-1", [gpu(0).uuid])
    assert manager.users() == {}
    assert wait_for(lambda: ("DEFAULT", [gpu(0).uuid]) in modes.calls)  # the withdrawn order's daemon


@pytest.mark.slow
def test_an_order_nobody_carries_out_fails_the_prepare_naming_who_should(mps_root: Path) -> None:
    manager = ClaimMps(root=mps_root, host_root="/run/nvidia/mps", driver="gpu.nvidia.com",
                       inventory=inventory(gpu(0)), log=LOG, ready_wait_s=0.3, poll_s=0.01,
                       runner="DaemonSet nvdp-dra-mps")
    with pytest.raises(MpsUnavailable, match=r"its order \(generation 1\) was not taken: "
                                             r"DaemonSet nvdp-dra-mps does not run on this node"):
        manager.use("claim-1", [gpu(0).uuid])
    assert manager.users() == {}
    assert not list((mps_root / "gpu.nvidia.com" / "orders").iterdir())  # withdrawn with the claim


def test_daemon_names_stay_short_for_gpu_sets() -> None:
    assert daemon_name("gpu.nvidia.com", ["GPU-A"]) == "gpu.nvidia.com/GPU-A"
    many = daemon_name("gpu.nvidia.com", ["GPU-B", "GPU-A"])
    assert many == daemon_name("gpu.nvidia.com", ["GPU-A", "GPU-B"])
    assert many.startswith("gpu.nvidia.com/gpus-")


def test_without_mps_an_mps_claim_is_refused_with_the_reason() -> None:
    sharing = NodeSharing(driver="gpu.nvidia.com", mps=None, log=LOG, no_mps_reason="dra.mps is off")
    with pytest.raises(ClaimProblem, match=r"asks for MPS, which this plugin does not run: dra\.mps is off"):
        sharing.apply("u1", ClaimShare(mps_gpus=("GPU-A",), env=("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)))
    assert sharing.apply("u1", ClaimShare()).env == ()


# --- MPS limits from allocated capacity, and the daemon's ceiling ---------------------------------------


def shared_t4(kind: str = "mps", replicas: int = 4) -> DraDevice:
    (device,) = t4_devices(shared_config(kind, replicas))
    return device


def allocated(device: str, consumed: dict[str, str] | None, config: list[Any] | None = None,
              driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": "n", "device": device}
    if consumed is not None:
        result["consumedCapacity"] = consumed
    return {"metadata": {"uid": "u1", "namespace": "ns", "name": "c"},
            "spec": {"devices": {"requests": [{"name": "gpu"}], "config": config or []}},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def mps_config_entry(**fields: Any) -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": fields}}}}


def share_of(claim: dict[str, Any], device: DraDevice) -> ClaimShare:
    sharing = NodeSharing(driver="gpu.nvidia.com", mps=None, log=LOG, no_mps_reason="")
    return sharing.share_of(claim, {device.name: device}, [device])


def test_consumed_capacity_is_read_per_device_and_summed() -> None:
    claim = allocated("gpu-0", {"memory": "4Gi", "replicas": "1"})
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "consumedCapacity": {"memory": "1Gi", "replicas": "1"}})
    results.append({**results[0], "driver": "other.example.com", "consumedCapacity": {"memory": "9Gi"}})
    assert consumed_capacity(claim, "gpu.nvidia.com") == {"gpu-0": {"memory": 5 * 1024 * MIB, "replicas": 2}}
    assert consumed_capacity(allocated("gpu-0", None), "gpu.nvidia.com") == {}
    with pytest.raises(ClaimProblem, match=r"results\[0\]\.consumedCapacity\.memory: 'lots' is not a "
                                           "quantity"):
        consumed_capacity(allocated("gpu-0", {"memory": "lots"}), "gpu.nvidia.com")


def test_a_claims_consumed_capacity_maps_to_its_mps_limits() -> None:
    device = shared_t4("mps", 4)  # a T4 shared 4 ways: each share 25%, 3840 MiB by default
    assert capacity_limits(device, {"memory": 8 * 1024 * MIB, "replicas": 2}) == MpsLimits(
        active_thread_percentage=50, pinned_memory_limit_mib=8192)
    # The default request policy: exactly the node's 1/N split.
    default = share_of(allocated("gpu-0", {"memory": str(15360 * MIB // 4), "replicas": "1"}), device)
    assert default.mps_limits == ClaimLimits(thread_percentage=25, memory_mib=((device.gpu_uuid, 3840),))
    # A claim allocated more than the default gets what it was allocated, not the node's 1/N.
    more = share_of(allocated("gpu-0", {"memory": "8Gi", "replicas": "2"}), device)
    assert more.mps_limits == ClaimLimits(thread_percentage=50, memory_mib=((device.gpu_uuid, 8192),))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in more.env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in more.env


def test_a_gpuconfig_limit_wins_over_the_capacity_and_the_capacity_fills_the_rest() -> None:
    device = shared_t4("timeSlicing", 4)  # replicas from the node, MPS from the claim's config
    claim = allocated("gpu-0", {"memory": "6Gi", "replicas": "1"},
                      config=[mps_config_entry(defaultActiveThreadPercentage=10)])
    share = share_of(claim, device)
    assert share.mps_limits == ClaimLimits(thread_percentage=10, memory_mib=((device.gpu_uuid, 6144),))
    both = allocated("gpu-0", {"memory": "6Gi", "replicas": "1"},
                     config=[mps_config_entry(defaultActiveThreadPercentage=40,
                                              defaultPinnedDeviceMemoryLimit="2Gi")])
    assert share_of(both, device).mps_limits == ClaimLimits(thread_percentage=40,
                                                            memory_mib=((device.gpu_uuid, 2048),))


def test_without_consumed_capacity_the_limits_are_the_configs_or_the_whole_gpu() -> None:
    # The DRAConsumableCapacity gate off: no consumedCapacity, the node's 1/N split as before.
    node = share_of(allocated("gpu-0", None), shared_t4("mps", 4))
    assert node.mps_limits.thread_percentage == 25
    plain = with_plan(dra_devices(T4), plan(Config(source="test"), T4))[0]
    whole = share_of(allocated("gpu-0", None, config=[mps_config_entry()]), plain)
    assert whole.uses_mps and whole.mps_limits == ClaimLimits()
    assert not any(e.startswith("CUDA_MPS_ACTIVE") or e.startswith("CUDA_MPS_PINNED") for e in whole.env)


def test_the_ceiling_is_the_largest_limit_among_the_claims() -> None:
    gpus = ("GPU-A", "GPU-B")
    quarter = ClaimLimits(thread_percentage=25, memory_mib=(("GPU-A", 4096), ("GPU-B", 2048)))
    half = ClaimLimits(thread_percentage=50, memory_mib=(("GPU-A", 8192), ("GPU-B", 1024)))
    assert daemon_ceiling(gpus, [quarter, quarter]) == Ceiling(25, (4096, 2048))
    assert daemon_ceiling(gpus, [quarter, half]) == Ceiling(50, (8192, 2048))
    # A claim without a limit on a GPU (or at all) leaves that part of the ceiling at the whole GPU.
    one_gpu = ClaimLimits(memory_mib=(("GPU-A", 1024),))
    assert daemon_ceiling(gpus, [quarter, one_gpu]) == Ceiling(100, (4096, None))
    assert daemon_ceiling(gpus, []) == Ceiling(100, (None, None))


def test_claims_asking_the_same_are_enforced_and_smaller_ones_are_advisory_below_the_ceiling() -> None:
    gpus = ("GPU-A",)
    quarter = ClaimLimits(thread_percentage=25, memory_mib=(("GPU-A", 4096),))
    half = ClaimLimits(thread_percentage=50, memory_mib=(("GPU-A", 8192),))
    same = daemon_ceiling(gpus, [quarter, quarter])
    assert enforcement(quarter, gpus, same) == Enforcement(enforced=True, advisory=())
    mixed = daemon_ceiling(gpus, [quarter, half])
    assert enforcement(half, gpus, mixed).enforced
    assert enforcement(quarter, gpus, mixed) == Enforcement(enforced=False, advisory=(
        "25% threads (enforced: 50%)", "4096 MiB on GPU-A (enforced: 8192 MiB)"))


def test_the_claims_ceiling_becomes_the_daemons_commands() -> None:
    inv = inventory(gpu(0), gpu(1, "Tesla P100-PCIE-16GB", 16280, (6, 0)))
    settings = MpsSettings(resource_name="gpu.nvidia.com/x", gpus=(
        MpsGpu(uuid=inv.gpus[0].uuid, index=0, ordinal=0, name="Tesla T4", memory_bytes=15360 * MIB,
               compute_capability=(7, 5), replicas=1),
        MpsGpu(uuid=inv.gpus[1].uuid, index=1, ordinal=1, name="Tesla P100", memory_bytes=16280 * MIB,
               compute_capability=(6, 0), replicas=1)), ceiling=Ceiling(50, (8192, 4096)))
    # Pre-Volta GPUs take no memory limit, as in device-plugin mode.
    assert settings.commands == ("set_default_active_thread_percentage 50",
                                 "set_default_device_pinned_mem_limit 0 8192M")
    unlimited = replace(settings, ceiling=Ceiling(100, (None, None)))
    assert unlimited.commands == ("set_default_active_thread_percentage 100",)
    # A running daemon: the defaults, and the same for each running server; no limit is the whole GPU.
    assert unlimited.retune_commands(["4000000"]) == (
        "set_default_active_thread_percentage 100", "set_default_device_pinned_mem_limit 0 15360M",
        "set_active_thread_percentage 4000000 100", "set_device_pinned_mem_limit 4000000 0 15360M")


def test_the_limits_file_round_trips_and_a_foreign_file_is_none(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    claims = {"u1": ClaimLimits(thread_percentage=25, memory_mib=(("GPU-A", 4096),))}
    write_limits(path, ("GPU-A",), Ceiling(25, (4096,)), claims)
    assert read_limits(path) == DaemonLimits(gpus=("GPU-A",), ceiling=Ceiling(25, (4096,)), claims=claims)
    path.write_text('{"gpus": ["GPU-A"], "ceiling": {"thread_percentage": 25, "memory_mib": []}, '
                    '"claims": {}}')
    assert read_limits(path) is None
    path.write_text("not json")
    assert read_limits(path) is None
    assert read_limits(tmp_path / "missing.json") is None


def test_a_time_slice_already_set_by_this_plugin_runs_no_nvidia_smi() -> None:
    calls: list[tuple[str, str]] = []
    failing: set[str] = set()

    def timeslice(gpu: str, interval: str) -> None:
        calls.append((gpu, interval))
        if gpu in failing:
            raise TimesliceError("nvidia-smi failed")

    sharing = NodeSharing(driver="gpu.nvidia.com", mps=None, log=LOG, no_mps_reason="", timeslice=timeslice)
    long_a = ClaimShare(timeslices=(("GPU-A", "Long"),))
    for uid in ("u1", "u2", "u3"):
        sharing.apply(uid, long_a)
    assert calls == [("GPU-A", "Long")]  # many claims at once: one run
    sharing.apply("u4", ClaimShare(timeslices=(("GPU-A", "Short"), ("GPU-B", "Long"))))
    sharing.apply("u5", long_a)
    assert calls[1:] == [("GPU-A", "Short"), ("GPU-B", "Long"), ("GPU-A", "Long")]
    # A failed run is not remembered: the next claim tries again.
    failing.add("GPU-C")
    for uid in ("u6", "u7"):
        with pytest.raises(ClaimProblem):
            sharing.apply(uid, ClaimShare(timeslices=(("GPU-C", "Long"),)))
    assert calls[-2:] == [("GPU-C", "Long"), ("GPU-C", "Long")]
