"""Strict MPS shares (sharing.mps strictShares): one share size per GPU in its slice, the same enforced
MPS limits for every claim on it, and a claim asking for other limits refused at prepare."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from nvdp.config.loader import ConfigError, load_config_text
from nvdp.config.model import Config, DeviceSelection, ReplicatedResource, ReplicatedResources, Sharing
from nvdp.dra.claims.causes import INVALID_CLAIM, INVALID_CONFIG
from nvdp.dra.claims.check import ClaimProblem
from nvdp.dra.claims.records import ClaimLimits
from nvdp.dra.claims.sharing.capacity import share_limits
from nvdp.dra.claims.sharing.gpuconfig import MpsLimits
from nvdp.dra.claims.sharing.mps import ClaimMps, daemon_name
from nvdp.dra.claims.sharing.node import NodeSharing, node_default
from nvdp.dra.claims.sharing.strict import share_text
from nvdp.dra.pool.devices import DraDevice, dra_devices, with_plan
from nvdp.dra.pool.slices import desired_slices, share_capacity, slice_content
from nvdp.inventory.profile import load_profile
from nvdp.mps.commands import Ceiling
from nvdp.mps.paths import ResourcePaths
from nvdp.plan import plan
from sim.mps import BIN_DIR, connect_client, limits_set
from sim.nvml import resolve_profile
from tests.mps.fakes import FakeModes
from tests.mps.ordered_runner import carried_out

MIB = 1024 * 1024
DRIVER = "gpu.nvidia.com"
LOG = logging.getLogger("test-dra-strict")
A100 = load_profile(resolve_profile("a100-sxm-8"))
T4 = load_profile(resolve_profile("t4"))
T4_QUARTER = str(15360 * MIB // 4)  # 3840 MiB


def strict_config(replicas: int = 4, devices: DeviceSelection | None = None, strict: bool = True) -> Config:
    entry = ReplicatedResource(name="nvidia.com/gpu", replicas=replicas, strict_shares=strict,
                               rename="nvidia.com/gpu.shared" if devices else None,
                               devices=devices or DeviceSelection())
    return Config(sharing=Sharing(mps=ReplicatedResources(resources=(entry,))), source="test")


def devices_of(config: Config, node: Any = T4) -> tuple[DraDevice, ...]:
    return with_plan(dra_devices(node), plan(config, node))


def strict_t4(replicas: int = 4) -> DraDevice:
    (device,) = devices_of(strict_config(replicas))
    return device


def published(*devices: DraDevice) -> list[dict[str, Any]]:
    (only,) = desired_slices(node="n", node_uid="", driver=DRIVER, devices=devices)
    kubernetes_validate.validate(only, "1.36", strict=True)
    return list(only["spec"]["devices"])


# --- the config ------------------------------------------------------------------------------------------


def test_strict_shares_is_read_per_mps_entry_and_refused_where_it_cannot_hold() -> None:
    text = (b"sharing:\n  mps:\n    resources:\n"
            b"    - {name: nvidia.com/gpu, replicas: 4, strictShares: true}\n")
    config = load_config_text(text, "c.yaml", env={})
    assert config.sharing.mps is not None and config.sharing.mps.resources[0].strict_shares
    loose = load_config_text(text.replace(b"true", b"false"), "c.yaml", env={}).sharing.mps
    assert loose is not None and not loose.resources[0].strict_shares
    sliced = text.replace(b"mps:", b"timeSlicing:")
    with pytest.raises(ConfigError) as caught:
        load_config_text(sliced, "c.yaml", env={})
    (issue,) = caught.value.issues
    assert str(issue).startswith("c.yaml:4: sharing.timeSlicing.resources[0].strictShares: strict shares are "
                                 "MPS ceilings, and time-slicing sets no limit at all; share this resource "
                                 "through sharing.mps")
    with pytest.raises(ConfigError, match=r"strictShares: strict shares need replicas of 2 or more: with "
                                          r"replicas 1 the GPU is not shared"):
        load_config_text(text.replace(b"replicas: 4", b"replicas: 1"), "c.yaml", env={})


# --- the slice -------------------------------------------------------------------------------------------


def test_a_strict_gpu_offers_one_share_size_in_its_request_policies() -> None:
    device = strict_t4()
    assert (device.strict, device.replicas, device.sharing) == (True, 4, "mps")
    (entry,) = published(device)
    assert entry["allowMultipleAllocations"] is True
    assert entry["capacity"] == {
        "memory": {"value": str(15360 * MIB),
                   "requestPolicy": {"default": T4_QUARTER, "validValues": [T4_QUARTER]}},
        "replicas": {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}},
    }
    assert share_capacity(device) == {"memory": int(T4_QUARTER), "replicas": 1}
    # Without strictShares the same GPU takes other sizes (a claim may ask for more of a share).
    (loose,) = published(*devices_of(strict_config(strict=False)))
    assert loose["capacity"]["replicas"]["requestPolicy"] == {"default": "1",
                                                               "validRange": {"min": "1", "step": "1"}}
    assert loose["capacity"]["memory"]["requestPolicy"] == {"default": T4_QUARTER}


def test_only_the_gpus_of_the_strict_entry_are_strict() -> None:
    config = Config(sharing=Sharing(mps=ReplicatedResources(resources=(
        ReplicatedResource(name="nvidia.com/gpu", replicas=2, rename="nvidia.com/gpu.half",
                           devices=DeviceSelection(all=False, refs=("0", "1")), strict_shares=True),
        ReplicatedResource(name="nvidia.com/gpu", replicas=4, rename="nvidia.com/gpu.quarter",
                           devices=DeviceSelection(all=False, refs=("2",)))))), source="test")
    devices = {d.name: d for d in devices_of(config, A100)}
    assert [n for n, d in devices.items() if d.strict] == ["gpu-0", "gpu-1"]
    assert (devices["gpu-2"].replicas, devices["gpu-2"].strict) == (4, False)
    assert not devices["gpu-3"].shared and not devices["gpu-3"].strict
    half = share_limits(devices["gpu-0"])
    assert half.active_thread_percentage == 50
    assert share_text(devices["gpu-0"]) == (
        f"1/2 of the GPU (50% threads, {half.pinned_memory_limit_mib} MiB pinned)")


def test_the_api_servers_rewrite_of_valid_values_compares_equal() -> None:
    (desired,) = desired_slices(node="n", node_uid="", driver=DRIVER, devices=[strict_t4()])
    listed = json.loads(json.dumps(desired).replace(f'"{T4_QUARTER}"', '"3840Mi"'))
    assert listed != desired
    assert slice_content(listed) == slice_content(desired)
    other = json.loads(json.dumps(desired).replace(f'["{T4_QUARTER}"]', '["1Gi"]'))
    assert slice_content(other) != slice_content(desired)


# --- prepare ---------------------------------------------------------------------------------------------


def claim(consumed: dict[str, str] | None = None, config: dict[str, Any] | None = None,
          device: str = "gpu-0") -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "n", "device": device}
    if consumed is not None:
        result["consumedCapacity"] = consumed
    return {"metadata": {"uid": "u1", "namespace": "team", "name": "train"},
            "spec": {"devices": {"requests": [{"name": "gpu"}], "config": [config] if config else []}},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def gpu_config(sharing: dict[str, Any]) -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}


def mps(**limits: Any) -> dict[str, Any]:
    return gpu_config({"strategy": "MPS", "mpsConfig": limits})


def share_of(obj: dict[str, Any], *devices: DraDevice) -> Any:
    node = NodeSharing(driver=DRIVER, mps=None, log=LOG, no_mps_reason="")
    return node.share_of(obj, {d.name: d for d in devices}, list(devices))


def refusal(obj: dict[str, Any], *devices: DraDevice) -> ClaimProblem:
    with pytest.raises(ClaimProblem) as caught:
        share_of(obj, *devices)
    return caught.value


QUARTER = ClaimLimits(thread_percentage=25, memory_mib=((T4.gpus[0].uuid, 3840),))
SHARE = "1/4 of the GPU (25% threads, 3840 MiB pinned)"


@pytest.mark.parametrize("obj", [
    claim({"memory": T4_QUARTER, "replicas": "1"}),  # the only size the slice offers
    claim({"memory": "3840Mi", "replicas": "1"}),  # the same, as the API server may write it
    claim(None),  # an API server without consumable capacity records none: the share all the same
    claim({"memory": T4_QUARTER, "replicas": "1"}, mps(defaultActiveThreadPercentage=25,
                                                       defaultPinnedDeviceMemoryLimit="3840Mi")),
    claim(None, mps()),  # a config that sets no limit gets the share
    claim(None, mps(defaultPinnedDeviceMemoryLimit="3840Mi")),
], ids=["allocated", "server-form", "no-consumed-capacity", "config-of-the-share", "config-no-limits",
        "config-memory-only"])
def test_every_claim_on_a_strict_gpu_has_the_share_as_its_limits(obj: dict[str, Any]) -> None:
    share = share_of(obj, strict_t4())
    assert share.mps_limits == QUARTER
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in share.env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3840M" in share.env
    assert node_default(strict_t4()).mps == MpsLimits(25, 3840)


def test_an_allocation_of_another_size_is_refused_naming_claim_size_and_share() -> None:
    # Written by hand, or by a scheduler that did not apply the request policy.
    err = refusal(claim({"memory": "7680Mi", "replicas": "2"}), strict_t4())
    assert err.cause == INVALID_CLAIM
    assert str(err).startswith(
        f"claim team/train (uid u1) was allocated 2 replicas and 7680 MiB of memory of gpu-0, whose GPU "
        f"offers strict MPS shares of {SHARE} only (1 replica and 3840 MiB of memory): its slice allows no "
        "other size"), err
    assert "delete the claim" in str(err)
    assert "1 replica and 1024 MiB" in str(refusal(claim({"memory": "1Gi", "replicas": "1"}), strict_t4()))


@pytest.mark.parametrize(("config", "asked"), [
    (mps(defaultActiveThreadPercentage=50), "MPS (50% threads, 3840 MiB pinned) from claim config #0"),
    (mps(defaultPinnedDeviceMemoryLimit="8Gi"), "MPS (25% threads, 8192 MiB pinned) from claim config #0"),
    (mps(defaultActiveThreadPercentage=10, defaultPinnedDeviceMemoryLimit="1Gi"),
     "MPS (10% threads, 1024 MiB pinned) from claim config #0"),
])
def test_a_config_asking_other_limits_is_refused_naming_claim_size_and_share(config: dict[str, Any],
                                                                            asked: str) -> None:
    err = refusal(claim({"memory": T4_QUARTER, "replicas": "1"}, config), strict_t4())
    assert err.cause == INVALID_CONFIG
    assert str(err).startswith(f"claim team/train (uid u1) asks for {asked} on gpu-0, whose GPU offers "
                               f"strict MPS shares of {SHARE} only: every claim on it has exactly that "
                               "limit, which MPS enforces"), err


@pytest.mark.parametrize(("config", "asked"), [
    (gpu_config({"strategy": "TimeSlicing"}), "TimeSlicing (interval Default) from claim config #0"),
    ({"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}}},
     "no sharing from claim config #0"),
])
def test_a_config_leaving_mps_on_a_strict_gpu_is_refused(config: dict[str, Any], asked: str) -> None:
    err = refusal(claim(None, config), strict_t4())
    assert err.cause == INVALID_CONFIG
    assert str(err).startswith(f"claim team/train (uid u1) asks for {asked} on gpu-0, whose GPU offers "
                               f"strict MPS shares of {SHARE} only"), err


def test_a_claim_whose_other_gpu_lowers_its_thread_share_is_refused() -> None:
    config = Config(sharing=Sharing(mps=ReplicatedResources(resources=(
        ReplicatedResource(name="nvidia.com/gpu", replicas=2, rename="nvidia.com/gpu.half",
                           devices=DeviceSelection(all=False, refs=("0",)), strict_shares=True),
        ReplicatedResource(name="nvidia.com/gpu", replicas=4, rename="nvidia.com/gpu.quarter",
                           devices=DeviceSelection(all=False, refs=("1",)))))), source="test")
    devices = {d.name: d for d in devices_of(config, A100)}
    half, quarter = devices["gpu-0"], devices["gpu-1"]
    obj = claim(None)
    results = obj["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "device": "gpu-1"})
    err = refusal(obj, half, quarter)
    assert str(err).startswith("claim team/train (uid u1) would run with 25% threads on all its GPUs"), err
    assert "gpu-0 offers strict MPS shares of 1/2 of the GPU (50% threads" in str(err)
    # Two strict GPUs of the same share in one claim: each has the share.
    two = strict_config(2, DeviceSelection(all=False, refs=("0", "1")))
    pair = {d.name: d for d in devices_of(two, A100)}
    share = share_of(obj, pair["gpu-0"], pair["gpu-1"])
    assert share.mps_limits.thread_percentage == 50 and len(share.mps_limits.memory_mib) == 2


def test_a_claim_without_strict_gpus_keeps_its_own_limits() -> None:
    (loose,) = devices_of(strict_config(strict=False))
    share = share_of(claim({"memory": "7680Mi", "replicas": "2"}), loose)
    assert share.mps_limits == ClaimLimits(thread_percentage=50, memory_mib=((T4.gpus[0].uuid, 7680),))


# --- the daemon's ceiling -----------------------------------------------------------------------------------


@pytest.fixture
def mps_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # unix socket paths are short
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_claims_on_a_strict_gpu_run_with_the_daemons_ceiling_equal_to_their_limit(
        mps_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prepared through NodeSharing as the plugin does: the ceiling ordered, the limits the stand-in
    control daemon was set to, and what a client that asks for the whole GPU gets."""
    monkeypatch.setenv("PATH", f"{BIN_DIR}:{__import__('os').environ['PATH']}")
    device = strict_t4()
    manager = ClaimMps(root=mps_root, host_root="/run/nvidia/mps", driver=DRIVER, inventory=T4, log=LOG,
                       ready_wait_s=10, poll_s=0.01)
    node = NodeSharing(driver=DRIVER, mps=manager, log=LOG, no_mps_reason="")
    gpus = (device.gpu_uuid,)
    with carried_out(mps_root, FakeModes):
        for uid, obj in (("u1", claim({"memory": T4_QUARTER, "replicas": "1"})),
                         ("u2", claim(None, mps(defaultActiveThreadPercentage=25)))):
            node.apply(uid, share_of(obj, device))
        settings = manager.settings(gpus)
        assert settings is not None and settings.ceiling == Ceiling(25, (3840,))
        paths = ResourcePaths(mps_root, daemon_name(DRIVER, gpus))
        greedy = connect_client(paths.pipe_dir, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
                                                 "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=15G"})
        assert (greedy["thread_percentage"], greedy["memory_mib"]) == (25.0, {"0": 3840})
        node.release("u1")
        node.release("u2")
    values = {(e["limit"], e["value"]) for e in limits_set(paths.log_dir)}
    assert values == {("active_thread_percentage", "25.0"), ("device_pinned_mem_limit", "3840M")}
