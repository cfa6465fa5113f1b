"""A down GPU's device taints and health messages from the health record (nvdp.dra.pool.taints), and the
slices that carry them (nvdp.dra.pool.slices.desired_slices with taints), checked against the 1.36 schema."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from msgspec.structs import replace

from nvdp.dra.pool.devices import DraDevice, dra_devices
from nvdp.dra.pool.slices import desired_slices, slice_content, slice_taints_of
from nvdp.dra.pool.taints import (
    GPU_LOST_KEY,
    MAX_MESSAGE,
    RECOVERY_KEY,
    UNMONITORED_KEY,
    XID_KEY,
    Taint,
    TaintError,
    check_down_effect,
    check_taint,
    device_health,
    slice_taints,
)
from nvdp.health.ledger import Cause, Check, Ledger, Settings
from nvdp.health.xids import Remedy, describe, xid_info
from nvdp.inventory.profile import load_profile
from sim.nvml import resolve_profile

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
QUIET = 300.0


def devices_of(profile: str) -> tuple[DraDevice, ...]:
    return dra_devices(load_profile(resolve_profile(profile)))


def xid_cause(xid: int) -> Cause:
    return Cause(describe(xid), xid_info(xid).remedy, xid)


def record_with(*faults: tuple[str, list[str], Cause], flap_limit: int = 3) -> dict[str, Any]:
    ledger = Ledger(Settings(after=QUIET, flap_limit=flap_limit))
    for gpu, devices, cause in faults:
        ledger.fault(gpu, devices, cause, T0)
    return ledger.record()


def taint_set(health: Any) -> set[tuple[str, str, str]]:
    return {(t.key, t.value, t.effect) for t in health.taints}


def test_healthy_devices_have_no_taints_and_say_healthy() -> None:
    devices = devices_of("a100-sxm-8")
    health = device_health(devices, None, quiet_s=QUIET)
    assert list(health) == [d.name for d in devices]
    assert all(h.healthy and not h.taints and h.message == "healthy" for h in health.values())
    assert slice_taints(health) == {}


def test_a_reset_xid_taints_its_gpu_with_nvidias_key_and_the_recovery_state() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[1].gpu_uuid
    health = device_health(devices, record_with((gpu, [gpu], xid_cause(48))), quiet_s=QUIET)
    down = health[devices[1].name]
    assert not down.healthy and down.since == T0
    assert taint_set(down) == {(XID_KEY, "48", "NoSchedule"), (RECOVERY_KEY, "needs-reset", "NoSchedule")}
    assert down.message.startswith("XID 48 (double-bit ECC error): needs a GPU reset")
    assert f"nvdp health clear {gpu}" in down.message and "DRA plugin's pod" in down.message
    # The other GPUs are untouched.
    assert all(h.healthy and not h.taints for name, h in health.items() if name != devices[1].name)


def test_a_wait_xid_says_when_the_gpu_comes_back_by_itself() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    assert xid_info(94).remedy is Remedy.WAIT
    down = device_health(devices, record_with((gpu, [gpu], xid_cause(94))), quiet_s=QUIET)[devices[0].name]
    assert taint_set(down) == {(XID_KEY, "94", "NoSchedule"), (RECOVERY_KEY, "recovering", "NoSchedule")}
    # T0 + 300 s = 08:05:00 UTC
    assert down.message == ("XID 94 (contained ECC error): comes back by itself at 08:05:00 UTC once NVML "
                            "finds it fine (each new critical XID restarts the wait)")


def test_a_lost_gpu_gets_nvidias_gpu_lost_taint() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[2].gpu_uuid
    lost = Cause("GPU is lost (NVML_ERROR_GPU_IS_LOST)", Remedy.RESET)
    down = device_health(devices, record_with((gpu, [gpu], lost)), quiet_s=QUIET)[devices[2].name]
    assert taint_set(down) == {(GPU_LOST_KEY, "", "NoSchedule"), (RECOVERY_KEY, "needs-reset", "NoSchedule")}
    assert {"key": GPU_LOST_KEY, "effect": "NoSchedule", "timeAdded": "2027-01-15T08:00:00Z"} in [
        t.api() for t in down.taints]


def test_flapping_says_it_stays_down_until_cleared() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    ledger = Ledger(Settings(after=1.0, flap_limit=1))
    ledger.fault(gpu, [gpu], xid_cause(94), T0)
    ledger.checked(gpu, Check(), T0 + 5)  # recovered
    ledger.fault(gpu, [gpu], xid_cause(94), T0 + 10)  # second down within the hour: flapping
    down = device_health(devices, ledger.record(), quiet_s=1.0)[devices[0].name]
    assert (RECOVERY_KEY, "flapping", "NoSchedule") in taint_set(down)
    assert "went down 2 times within an hour (flapping)" in down.message
    assert f"nvdp health clear {gpu}" in down.message


def test_recovery_off_says_it_stays_down_until_the_plugin_restarts() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    ledger = Ledger(Settings(after=None))
    ledger.fault(gpu, [gpu], xid_cause(94), T0)
    down = device_health(devices, ledger.record(), quiet_s=None)[devices[0].name]
    assert (RECOVERY_KEY, "recovery-off", "NoSchedule") in taint_set(down)
    assert "until the DRA plugin restarts" in down.message


def test_no_execute_is_applied_to_a_down_gpus_taints_only() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    health = device_health(devices, record_with((gpu, [gpu], xid_cause(48))), quiet_s=QUIET,
                           down_effect="NoExecute", informational={devices[1].gpu_uuid: (13, T0)})
    assert {t.effect for t in health[devices[0].name].taints} == {"NoExecute"}
    assert taint_set(health[devices[1].name]) == {(XID_KEY, "13", "None")}


def test_informational_xids_and_unmonitored_gpus_get_none_taints_and_stay_healthy() -> None:
    devices = devices_of("a100-sxm-8")
    health = device_health(devices, None, quiet_s=QUIET, informational={devices[0].gpu_uuid: (13, T0)},
                           unmonitored=[devices[1].gpu_uuid])
    first, second = health[devices[0].name], health[devices[1].name]
    assert first.healthy and taint_set(first) == {(XID_KEY, "13", "None")}
    assert "XID 13 (graphics engine exception) at 2027-01-15T08:00:00Z is informational" in first.message
    assert second.healthy and taint_set(second) == {(UNMONITORED_KEY, "", "None")}


def test_mig_devices_carry_their_gpus_fault_or_their_own() -> None:
    devices = devices_of("h100-mig-8")
    gpu0 = [d for d in devices if d.gpu_uuid == devices[0].gpu_uuid]
    gpu1 = [d for d in devices if d.gpu_uuid != devices[0].gpu_uuid][:3]
    whole = gpu1[0].gpu_uuid
    record = record_with((gpu0[0].gpu_uuid, [gpu0[2].uuid], xid_cause(94)), (whole, [whole], xid_cause(48)))
    health = device_health(devices, record, quiet_s=QUIET)
    # Only the MIG device that went down on GPU 0; every MIG device of GPU 1 (the whole GPU is down).
    assert [health[d.name].healthy for d in gpu0[:3]] == [True, True, False]
    assert all(not health[d.name].healthy for d in devices if d.gpu_uuid == whole)
    assert health[gpu1[0].name].message.endswith(f"(GPU {whole})")


@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
def test_shared_devices_carry_their_gpus_health(strategy: str) -> None:
    devices = tuple(replace(d, replicas=4, sharing=strategy) for d in devices_of("a100-sxm-8"))
    gpu = devices[0].gpu_uuid
    down = device_health(devices, record_with((gpu, [gpu], xid_cause(48))), quiet_s=QUIET)[devices[0].name]
    assert not down.healthy and (XID_KEY, "48", "NoSchedule") in taint_set(down)


def test_messages_are_cut_to_the_kubelets_limit() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    long = Cause("NVML does not answer for it (" + "x" * 2000 + ")", Remedy.RESET)
    down = device_health(devices, record_with((gpu, [gpu], long)), quiet_s=QUIET)[devices[0].name]
    assert len(down.message) == MAX_MESSAGE and down.message.endswith("...")


def test_bad_taints_and_effects_are_refused_with_the_field_named() -> None:
    check_taint(Taint(XID_KEY, "NoSchedule", "48"), "taints[0]")
    with pytest.raises(TaintError, match=r"^taints\[0\]\.value: '" + "9" * 64):
        check_taint(Taint(XID_KEY, "NoSchedule", "9" * 64), "taints[0]")
    with pytest.raises(TaintError, match=r"^taints\[0\]\.key: "):
        check_taint(Taint("gpu.nvidia.com/" + "k" * 64, "NoSchedule"), "taints[0]")
    with pytest.raises(TaintError, match=r"^taints\[0\]\.effect: 'Evict' is not one of"):
        check_taint(Taint(XID_KEY, "Evict"), "taints[0]")
    with pytest.raises(TaintError, match=r"^flags\.plugin\.healthTaintEffect: 'Evict'"):
        check_down_effect("Evict")
    with pytest.raises(TaintError, match="healthTaintEffect: 'None'"):
        device_health(devices_of("t4"), None, quiet_s=QUIET, down_effect="None")


def test_every_taint_made_is_one_the_api_accepts() -> None:
    devices = devices_of("a100-sxm-8")
    gpus = [d.gpu_uuid for d in devices]
    record = record_with((gpus[0], [gpus[0]], xid_cause(48)), (gpus[1], [gpus[1]], xid_cause(94)),
                         (gpus[2], [gpus[2]], Cause("GPU is lost (x)", Remedy.RESET)))
    health = device_health(devices, record, quiet_s=QUIET, informational={gpus[3]: (13, T0)},
                           unmonitored=[gpus[4]])
    for h in health.values():
        for i, taint in enumerate(h.taints):
            check_taint(taint, f"{h.device}.taints[{i}]")


# -- the slices ---------------------------------------------------------------------------------------


def make(devices: tuple[DraDevice, ...], **kw: Any) -> list[dict[str, Any]]:
    return desired_slices(node="node-a", node_uid="uid-1", driver="gpu.nvidia.com", devices=devices, **kw)


def test_with_taints_a_down_gpu_stays_in_the_slice_tainted_and_the_slice_is_valid() -> None:
    devices = devices_of("h100-mig-8")
    whole = devices[-1].gpu_uuid
    record = record_with((whole, [whole], xid_cause(48)))
    taints = slice_taints(device_health(devices, record, quiet_s=QUIET, down_effect="NoExecute",
                                        informational={devices[0].gpu_uuid: (13, T0)}))
    (obj,) = make(devices, unhealthy=frozenset({whole}), taints=taints)
    kubernetes_validate.validate(obj, "1.36", strict=True)
    assert [d["name"] for d in obj["spec"]["devices"]] == [d.name for d in devices]
    carried = slice_taints_of(obj)
    assert set(carried) == set(taints)
    some = next(d.name for d in devices if d.gpu_uuid == whole)
    assert {"key": XID_KEY, "value": "48", "effect": "NoExecute", "timeAdded": "2027-01-15T08:00:00Z"} in \
        carried[some]


def test_without_taints_down_devices_leave_the_slice_as_before() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    (obj,) = make(devices, unhealthy=frozenset({gpu}))
    assert devices[0].name not in [d["name"] for d in obj["spec"]["devices"]]
    assert slice_taints_of(obj) == {}


def test_with_taints_slices_hold_at_most_64_devices() -> None:
    devices = devices_of("h100-mig-8")
    many = tuple(replace(d, name=f"{d.name}-{i}") for i in range(6) for d in devices)  # 168 devices
    slices = make(many, taints={})
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 64, 40]
    assert len(make(many)) == 2  # 128 per slice without taints


def test_a_taint_coming_or_going_changes_the_slice_content() -> None:
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    clean = make(devices, taints={})
    tainted = make(devices, taints=slice_taints(device_health(
        devices, record_with((gpu, [gpu], xid_cause(48))), quiet_s=QUIET)))
    assert slice_content(clean[0]) != slice_content(tainted[0])
    assert slice_content(make(devices, taints={})[0]) == slice_content(clean[0])


def test_informational_xids_are_kept_for_the_quiet_period() -> None:
    from nvdp.dra.pool.taints import InformationalXids

    held = InformationalXids()
    assert held.next_expiry(QUIET) is None
    held.seen("GPU-a", 13, T0)
    held.seen("GPU-a", 31, T0 + 10)  # the latest per GPU
    held.seen("GPU-b", 43, T0 + 20)
    assert held.current(T0 + 30, QUIET) == {"GPU-a": (31, T0 + 10), "GPU-b": (43, T0 + 20)}
    assert held.next_expiry(QUIET) == T0 + 10 + QUIET
    assert held.current(T0 + 10 + QUIET, QUIET) == {"GPU-b": (43, T0 + 20)}
    assert held.current(T0 + 20 + 300, None) == {}  # recovery off: five minutes


def test_device_health_for_takes_the_configs_quiet_period_and_effect() -> None:
    from nvdp.config.loader import load_config_text
    from nvdp.dra.pool.taints import device_health_for

    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    text = "flags:\n  plugin:\n    healthRecoveryAfter: 10m\n    healthTaintEffect: NoExecute\n"
    config = load_config_text(text, env={})
    down = device_health_for(config, devices, record_with((gpu, [gpu], xid_cause(94))))[devices[0].name]
    assert {t.effect for t in down.taints} == {"NoExecute"}
    assert "comes back by itself at 08:10:00 UTC" in down.message


def test_the_documented_diagnostics_claim_is_valid_and_tolerates_a_down_gpu() -> None:
    import re
    from pathlib import Path

    import yaml

    from nvdp.dra.pool.taints import Toleration, tolerated

    text = (Path(__file__).resolve().parents[2] / "docs" / "dra.md").read_text()
    (block,) = re.findall(r"```yaml\n(# A diagnostics pod.*?)```", text, re.S)
    template = yaml.safe_load(block)
    kubernetes_validate.validate(template, "1.36", strict=True)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    tolerations = [Toleration(**t) for t in request["exactly"]["tolerations"]]
    devices = devices_of("a100-sxm-8")
    gpu = devices[0].gpu_uuid
    for cause in (xid_cause(48), xid_cause(94)):
        down = device_health(devices, record_with((gpu, [gpu], cause)), quiet_s=QUIET,
                             down_effect="NoExecute")[devices[0].name]
        assert tolerated(tolerations, down.taints)
        # Kubernetes 1.36's device taint eviction controller keeps a pod only for a toleration that
        # names NoExecute (an effect-less one is not enough; tests/e2e/test_dra_health.py).
        assert tolerated([t for t in tolerations if t.effect == "NoExecute"], down.taints)
