"""The sharing of a claim's devices (nvdp.dra.claims.sharing.gpuconfig): NVIDIA's GpuConfig and
MigDeviceConfig decoded
strictly, NVIDIA's precedence of class and claim configs, MPS limits checked against the devices."""

from __future__ import annotations

from typing import Any

import pytest

from nvdp.dra.claims.sharing.gpuconfig import (
    TIMESLICE_VALUES,
    DeviceSharing,
    MpsLimits,
    SharingProblem,
    device_sharing,
    summary,
)
from nvdp.dra.pool.devices import DraDevice, by_name, dra_devices
from nvdp.inventory.profile import load_profile
from sim.nvml import resolve_profile

DRIVER = "gpu.nvidia.com"
API = "resource.nvidia.com/v1beta1"


def node(profile: str) -> dict[str, DraDevice]:
    return by_name(dra_devices(load_profile(resolve_profile(profile))))


T4 = node("t4")  # gpu-0, 15360 MiB
A100 = node("a100-sxm-8")  # gpu-0 .. gpu-7, 40960 MiB each
H100_MIG = node("h100-mig-8")  # MIG devices only
MIXED = {**A100, **H100_MIG}  # full GPUs and MIG devices side by side
MIG = "gpu-0-mig-1g10gb-19-0"
T4_UUID = T4["gpu-0"].uuid
GPU0 = ("gpu", "gpu-0")  # request "gpu" allocated gpu-0
P0 = "spec.devices.config[0].opaque.parameters"
MPS0 = f"{P0}.sharing.mpsConfig"


def params(kind: str = "GpuConfig", sharing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": API, "kind": kind, **extra}
    if sharing is not None:
        body["sharing"] = sharing
    return body


def entry(parameters: Any, *requests: str, driver: str = DRIVER, source: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        config["requests"] = list(requests)
    if source is not None:
        config["source"] = source
    return config


def mps(kind: str = "GpuConfig", requests: tuple[str, ...] = (), **fields: Any) -> dict[str, Any]:
    return entry(params(kind, {"strategy": "MPS", "mpsConfig": fields}), *requests)


def timeslicing(interval: str | None = None, kind: str = "GpuConfig", requests: tuple[str, ...] = ()
                ) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    return entry(params(kind, sharing), *requests)


def claim(*results: tuple[str, str] | tuple[str, str, str], config: list[Any] | None = None,
          allocated_config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A claim allocated `results` ((request, device) or (request, device, driver)); `config` is the
    spec's, `allocated_config` the allocation's copy (absent when None)."""
    listed = [{"request": r[0], "device": r[1], "driver": r[2] if len(r) > 2 else DRIVER, "pool": "node-a"}
              for r in results]
    devices: dict[str, Any] = {"results": listed}
    if allocated_config is not None:
        devices["config"] = allocated_config
    body: dict[str, Any] = {"metadata": {"name": "c", "namespace": "default", "uid": "u"},
                            "status": {"allocation": {"devices": devices}}}
    if config is not None:
        body["spec"] = {"devices": {"config": config}}
    return body


def problem(claim_: dict[str, Any], devices: dict[str, DraDevice] = T4) -> str:
    with pytest.raises(SharingProblem) as err:
        device_sharing(claim_, DRIVER, devices)
    return str(err.value)


def one(claim_: dict[str, Any], devices: dict[str, DraDevice] = T4, device: str = "gpu-0") -> DeviceSharing:
    return device_sharing(claim_, DRIVER, devices)[device]


# --- the strategies ----------------------------------------------------------------------------------


def test_a_claim_without_config_gets_no_sharing_or_the_nodes() -> None:
    c = claim(GPU0, ("gpu", "gpu-1"))
    assert device_sharing(c, DRIVER, A100) == {"gpu-0": DeviceSharing(), "gpu-1": DeviceSharing()}
    seen: list[str] = []

    def node_sharing(device: DraDevice) -> DeviceSharing:
        seen.append(device.name)
        return DeviceSharing(strategy="TimeSlicing", source="node config")

    found = device_sharing(c, DRIVER, A100, default=node_sharing)
    assert found["gpu-1"] == DeviceSharing(strategy="TimeSlicing", source="node config")
    assert seen == ["gpu-0", "gpu-1"]


def test_timeslicing_on_a_full_gpu_with_and_without_an_interval() -> None:
    got = one(claim(GPU0, config=[timeslicing("Short")]))
    assert got == DeviceSharing(strategy="TimeSlicing", interval="Short", source="claim config #0")
    # NVIDIA normalises a TimeSlicing GpuConfig without an interval to Default
    assert one(claim(GPU0, config=[timeslicing()])).interval == "Default"
    assert TIMESLICE_VALUES == {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


@pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
def test_each_interval_is_accepted(interval: str) -> None:
    assert one(claim(GPU0, config=[timeslicing(interval)])).interval == interval


def test_an_unknown_interval_is_refused_naming_the_values() -> None:
    text = problem(claim(GPU0, config=[timeslicing("VeryLong")]))
    assert text.startswith(f"{P0}.sharing.timeSlicingConfig.interval: ")
    assert "'VeryLong'" in text and "Default, Short, Medium or Long" in text


def test_mps_on_a_full_gpu_gives_its_limits() -> None:
    got = one(claim(GPU0, config=[mps(defaultActiveThreadPercentage=25,
                                                  defaultPinnedDeviceMemoryLimit="4Gi")]))
    assert got == DeviceSharing(strategy="MPS", mps=MpsLimits(active_thread_percentage=25,
                                                              pinned_memory_limit_mib=4096),
                                source="claim config #0")
    bare = entry(params(sharing={"strategy": "MPS"}))
    assert one(claim(GPU0, config=[bare])) == DeviceSharing(strategy="MPS", mps=MpsLimits(),
                                                                        source="claim config #0")


def test_a_config_without_sharing_means_no_sharing_over_the_nodes() -> None:
    c = claim(GPU0, config=[entry(params())])
    got = device_sharing(c, DRIVER, T4, default=lambda d: DeviceSharing(strategy="MPS", mps=MpsLimits()))
    assert got["gpu-0"] == DeviceSharing(source="claim config #0")


def test_an_unknown_or_missing_strategy_is_refused() -> None:
    c = claim(GPU0, config=[timeslicing(), entry(params(sharing={"strategy": "Exclusive"}))])
    text = problem(c)
    assert text.startswith("spec.devices.config[1].opaque.parameters.sharing.strategy: ")
    assert "unknown sharing strategy 'Exclusive'" in text and "use TimeSlicing or MPS" in text
    text = problem(claim(GPU0, config=[entry(params(sharing={}))]))
    assert text.startswith(f"{P0}.sharing.strategy: missing")
    assert "TimeSlicing or MPS" in text


def test_each_strategys_settings_go_with_it_only() -> None:
    both = {"timeSlicingConfig": {"interval": "Short"}, "mpsConfig": {}}
    text = problem(claim(GPU0, config=[entry(params(sharing={"strategy": "TimeSlicing", **both}))]))
    assert text.startswith(f"{P0}.sharing.mpsConfig: ")
    assert "strategy MPS" in text
    text = problem(claim(GPU0, config=[entry(params(sharing={"strategy": "MPS", **both}))]))
    assert text.startswith(f"{P0}.sharing.timeSlicingConfig: ")
    assert "strategy TimeSlicing" in text


# --- MPS settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("percentage", [0, 101, -5])
def test_thread_percentage_out_of_range_is_refused_naming_the_field(percentage: int) -> None:
    c = claim(GPU0, config=[timeslicing(), mps(defaultActiveThreadPercentage=percentage)])
    text = problem(c)
    assert text.startswith(
        "spec.devices.config[1].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: ")
    assert f"{percentage} is out of range" in text and "1 to 100" in text


@pytest.mark.parametrize("percentage", [1, 100])
def test_thread_percentage_bounds_are_accepted(percentage: int) -> None:
    got = one(claim(GPU0, config=[mps(defaultActiveThreadPercentage=percentage)]))
    assert got.mps == MpsLimits(active_thread_percentage=percentage)


@pytest.mark.parametrize(("value", "got"), [("25", "a string"), (25.5, "a decimal number"),
                                            (True, "true or false")])
def test_thread_percentage_must_be_a_whole_number(value: Any, got: str) -> None:
    text = problem(claim(GPU0, config=[mps(defaultActiveThreadPercentage=value)]))
    assert text == (f"{MPS0}.defaultActiveThreadPercentage: "
                    f"expected a whole number, got {got}; set a whole number from 1 to 100")


@pytest.mark.parametrize(("limit", "mib"), [
    ("4Gi", 4096), ("512Mi", 512), ("1G", 953), ("1500M", 1430), ("0.5Gi", 512), ("1073741824", 1024),
    (1073741824, 1024), ("1Mi", 1), ("1048577", 1), ("15Gi", 15360),
])
def test_pinned_memory_limits_are_quantities_in_whole_mib(limit: Any, mib: int) -> None:
    got = one(claim(GPU0, config=[mps(defaultPinnedDeviceMemoryLimit=limit)]))
    assert got.mps == MpsLimits(pinned_memory_limit_mib=mib)


@pytest.mark.parametrize("limit", ["1Ki", "0", "1048575", "-1Gi", 0])
def test_a_limit_under_one_mib_is_refused(limit: Any) -> None:
    text = problem(claim(GPU0, config=[mps(defaultPinnedDeviceMemoryLimit=limit)]))
    assert text.startswith(f"{MPS0}."
                           "defaultPinnedDeviceMemoryLimit: ")
    assert "less than 1 MiB" in text and "1Mi or more" in text


@pytest.mark.parametrize("limit", ["4GB", "lots", 1.5, True, ["4Gi"]])
def test_a_limit_that_is_not_a_quantity_is_refused(limit: Any) -> None:
    text = problem(claim(GPU0, config=[mps(defaultPinnedDeviceMemoryLimit=limit)]))
    assert text.startswith(f"{MPS0}."
                           "defaultPinnedDeviceMemoryLimit: ")
    assert "not a quantity" in text


def test_a_limit_above_the_gpus_memory_is_refused_naming_device_memory_and_limit() -> None:
    text = problem(claim(GPU0, config=[mps(defaultPinnedDeviceMemoryLimit="16Gi")]))
    assert text.startswith(f"{MPS0}."
                           "defaultPinnedDeviceMemoryLimit: 16Gi is more than the memory of device gpu-0 "
                           "(15360 MiB)")
    assert "at most 15360Mi" in text


def test_per_device_limits_by_uuid_and_by_index_override_the_default() -> None:
    c = claim(("gpus", "gpu-0"), ("gpus", "gpu-1"), ("gpus", "gpu-2"),
              config=[mps(defaultPinnedDeviceMemoryLimit="2Gi",
                          defaultPerDevicePinnedMemoryLimit={A100["gpu-1"].uuid: "8Gi", "2": "1Gi"})])
    got = device_sharing(c, DRIVER, A100)
    limits = {name: s.mps.pinned_memory_limit_mib for name, s in got.items() if s.mps is not None}
    assert limits == {"gpu-0": 2048, "gpu-1": 8192, "gpu-2": 1024}


def test_per_device_limits_without_a_default_leave_the_others_unlimited() -> None:
    c = claim(("gpus", "gpu-0"), ("gpus", "gpu-1"),
              config=[mps(defaultPerDevicePinnedMemoryLimit={"0": "3Gi"})])
    got = device_sharing(c, DRIVER, A100)
    assert got["gpu-0"].mps == MpsLimits(pinned_memory_limit_mib=3072)
    assert got["gpu-1"].mps == MpsLimits()


def test_a_per_device_override_exempts_its_device_from_a_default_too_large_for_it() -> None:
    c = claim(GPU0, config=[mps(defaultPinnedDeviceMemoryLimit="20Gi",
                                            defaultPerDevicePinnedMemoryLimit={T4_UUID: "10Gi"})])
    assert one(c).mps == MpsLimits(pinned_memory_limit_mib=10240)


@pytest.mark.parametrize("key", ["1", "-1", "abc", "GPU-00000000-0000-0000-0000-000000000000", "0x0", " 0"])
def test_a_per_device_key_naming_no_device_of_the_claim_is_refused(key: str) -> None:
    text = problem(claim(GPU0, config=[mps(defaultPerDevicePinnedMemoryLimit={key: "1Gi"})]))
    assert text.startswith(f"{MPS0}."
                           f"defaultPerDevicePinnedMemoryLimit[{key!r}]: names no device of this claim")
    assert T4_UUID in text and "0 to 0" in text


def test_a_uuid_of_another_drivers_result_is_no_key() -> None:
    other = A100["gpu-1"].uuid
    c = claim(GPU0, ("x", "gpu-1", "other.example.com"),
              config=[mps(defaultPerDevicePinnedMemoryLimit={other: "1Gi"})])
    assert "names no device of this claim" in problem(c, A100)


def test_a_per_device_limit_above_the_memory_is_refused_naming_its_key() -> None:
    text = problem(claim(GPU0, config=[mps(defaultPerDevicePinnedMemoryLimit={T4_UUID: "20Gi"})]))
    assert text.startswith(f"{MPS0}."
                           f"defaultPerDevicePinnedMemoryLimit[{T4_UUID!r}]: 20Gi is more than the memory of "
                           "device gpu-0 (15360 MiB)")


def test_two_keys_for_one_device_must_agree() -> None:
    c = claim(GPU0, config=[mps(defaultPerDevicePinnedMemoryLimit={T4_UUID: "1Gi", "0": "2Gi"})])
    assert "has a limit under another key already" in problem(c)
    same = claim(GPU0, config=[mps(defaultPerDevicePinnedMemoryLimit={T4_UUID: "1Gi", "0": "1024Mi"})])
    assert one(same).mps == MpsLimits(pinned_memory_limit_mib=1024)


# --- MIG devices ---------------------------------------------------------------------------------------


def test_mps_on_a_mig_device_is_refused() -> None:
    for config in (mps("MigDeviceConfig", ("mig",)), mps("MigDeviceConfig")):
        text = problem(claim(("mig", MIG), config=[config]), H100_MIG)
        assert text == (f"{P0}.sharing.strategy: MPS is not supported on MIG "
                        f"devices (device {MIG}): share MIG devices with TimeSlicing, or use full GPUs")


def test_timeslicing_on_a_mig_device_has_no_interval() -> None:
    got = one(claim(("mig", MIG), config=[timeslicing(kind="MigDeviceConfig")]), H100_MIG, MIG)
    assert got == DeviceSharing(strategy="TimeSlicing", source="claim config #0")
    text = problem(claim(("mig", MIG), config=[timeslicing("Short", kind="MigDeviceConfig")]), H100_MIG)
    assert text.startswith(f"{P0}.sharing.timeSlicingConfig: a MigDeviceConfig "
                           "has no timeSlicingConfig")


def test_a_config_of_the_wrong_kind_naming_the_request_is_refused() -> None:
    text = problem(claim(("mig", MIG), config=[timeslicing(requests=("mig",))]), H100_MIG)
    assert text.startswith(f"{P0}.kind: GpuConfig names request 'mig', which "
                           f"was allocated a MIG device ({MIG}); use kind MigDeviceConfig")
    text = problem(claim(GPU0, config=[timeslicing(kind="MigDeviceConfig", requests=("gpu",))]))
    assert ("MigDeviceConfig names request 'gpu', which was allocated a full GPU (gpu-0); "
            "use kind GpuConfig") in text


def test_a_config_naming_no_request_applies_only_to_devices_of_its_kind() -> None:
    c = claim(GPU0, ("mig", MIG), config=[timeslicing("Long"), timeslicing(kind="MigDeviceConfig"),
                                                      mps("GpuConfig", defaultActiveThreadPercentage=50)])
    got = device_sharing(c, DRIVER, MIXED)
    assert got["gpu-0"] == DeviceSharing(strategy="MPS", mps=MpsLimits(active_thread_percentage=50),
                                         source="claim config #2")
    assert got[MIG] == DeviceSharing(strategy="TimeSlicing", source="claim config #1")


def test_a_config_of_the_other_kind_leaves_the_device_to_the_node() -> None:
    c = claim(("mig", MIG), config=[timeslicing()])
    node_sharing = DeviceSharing(strategy="TimeSlicing", source="node config")
    assert device_sharing(c, DRIVER, H100_MIG, default=lambda d: node_sharing) == {MIG: node_sharing}


# --- precedence ----------------------------------------------------------------------------------------


def copied(source: str, config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "source": source}


def test_claim_configs_win_over_class_configs() -> None:
    class_mps = copied("FromClass", mps(requests=("gpu",), defaultActiveThreadPercentage=10))
    claim_ts = timeslicing("Medium", requests=("gpu",))
    c = claim(GPU0, config=[claim_ts],
              allocated_config=[copied("FromClaim", claim_ts), class_mps])  # the class's listed last
    assert one(c) == DeviceSharing(strategy="TimeSlicing", interval="Medium", source="claim config #0")


def test_a_class_config_applies_where_the_claim_has_none() -> None:
    class_mps = copied("FromClass", mps(requests=("gpu",), defaultActiveThreadPercentage=10))
    c = claim(GPU0, allocated_config=[class_mps])
    assert one(c) == DeviceSharing(strategy="MPS", mps=MpsLimits(active_thread_percentage=10),
                                   source="class config #0")


def test_later_entries_of_one_source_win() -> None:
    c = claim(GPU0, config=[timeslicing("Short", requests=("gpu",)),
                                        timeslicing("Long", requests=("gpu",))])
    assert one(c).interval == "Long"
    classes = [copied("FromClass", timeslicing("Short", requests=("gpu",))),
               copied("FromClass", timeslicing("Medium", requests=("gpu",)))]
    got = one(claim(GPU0, allocated_config=classes))
    assert (got.interval, got.source) == ("Medium", "class config #1")


def test_the_highest_config_that_applies_wins_named_or_not_as_nvidia_walks_them() -> None:
    named_first = [timeslicing("Short", requests=("gpu",)), timeslicing("Long")]
    assert one(claim(GPU0, config=named_first)).interval == "Long"
    unnamed_first = [timeslicing("Long"), timeslicing("Short", requests=("gpu",))]
    assert one(claim(GPU0, config=unnamed_first)).interval == "Short"
    # a claim config naming no request is above a class config naming the request
    c = claim(GPU0, allocated_config=[copied("FromClass", timeslicing("Short", requests=("gpu",))),
                                                  copied("FromClaim", timeslicing("Long"))])
    assert one(c).interval == "Long"


def test_a_config_naming_other_requests_does_not_apply() -> None:
    c = claim(("a", "gpu-0"), ("b", "gpu-1"),
              config=[timeslicing("Short"), timeslicing("Long", requests=("b",))])
    got = device_sharing(c, DRIVER, A100)
    assert (got["gpu-0"].interval, got["gpu-1"].interval) == ("Short", "Long")


def test_a_wrong_kind_below_the_winner_is_never_looked_at() -> None:
    c = claim(("mig", MIG), config=[timeslicing(requests=("mig",)), timeslicing(kind="MigDeviceConfig")])
    assert one(c, H100_MIG, MIG).strategy == "TimeSlicing"


def test_subrequests_are_named_by_their_main_request_or_in_full() -> None:
    c = claim(("gpu/large", "gpu-0"), ("gpu/small", "gpu-1"), ("other", "gpu-2"),
              config=[timeslicing("Short", requests=("gpu",)), timeslicing("Long", requests=("gpu/small",))])
    got = device_sharing(c, DRIVER, A100)
    assert [got[d].interval for d in ("gpu-0", "gpu-1")] == ["Short", "Long"]
    assert got["gpu-2"] == DeviceSharing()
    # a config naming one subrequest does not name its siblings or the main request
    c = claim(("gpu/large", "gpu-0"), config=[timeslicing("Long", requests=("gpu/small",))])
    assert one(c, A100) == DeviceSharing()


# --- where configs come from ------------------------------------------------------------------------


def test_the_allocations_copy_is_authoritative_and_paths_name_the_entry() -> None:
    bad = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "Exclusive"}}
    # a class config: named by its place in the allocation
    c = claim(GPU0, allocated_config=[copied("FromClass", entry(bad, "gpu"))])
    assert problem(c).startswith("class config (status.allocation.devices.config[0]).opaque.parameters."
                                 "sharing.strategy: unknown sharing strategy 'Exclusive'")
    # a claim config the scheduler copied: named by its place in the spec
    c = claim(GPU0, config=[timeslicing(), entry(bad)],
              allocated_config=[copied("FromClass", timeslicing("Short", requests=("gpu",))),
                                copied("FromClaim", timeslicing()), copied("FromClaim", entry(bad))])
    assert problem(c).startswith("spec.devices.config[1].opaque.parameters.sharing.strategy: ")
    # a copy that does not line up with the spec: named by its place in the allocation
    c = claim(GPU0, allocated_config=[copied("FromClaim", entry(bad))])
    assert problem(c).startswith("claim config (status.allocation.devices.config[0]).opaque.parameters.")


def test_the_spec_is_not_read_when_the_allocation_has_its_copy() -> None:
    c = claim(GPU0, config=[timeslicing("Short")], allocated_config=[])
    assert one(c) == DeviceSharing()


def test_an_unknown_config_source_is_refused() -> None:
    c = claim(GPU0, allocated_config=[copied("FromNode", timeslicing())])
    assert problem(c).startswith(
        "status.allocation.devices.config[0].source: 'FromNode' is not a config source")


def test_other_drivers_configs_and_results_are_skipped() -> None:
    garbage = entry({"whatever": True, "kind": "Unknown"}, driver="other.example.com")
    not_opaque = {"requests": ["gpu"], "future": {"x": 1}}
    c = claim(GPU0, ("x", "not-a-device-here", "other.example.com"),
              config=[timeslicing("Short"), garbage, not_opaque])
    assert device_sharing(c, DRIVER, T4) == {"gpu-0": DeviceSharing(strategy="TimeSlicing", interval="Short",
                                                                    source="claim config #0")}


def test_a_config_of_this_driver_is_checked_even_when_it_applies_to_no_result() -> None:
    c = claim(GPU0, config=[mps(requests=("unused",), defaultActiveThreadPercentage=0)])
    assert "defaultActiveThreadPercentage: 0 is out of range" in problem(c)


# --- strict decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("parameters", "message"), [
    (None, f"{P0}: expected an object (GpuConfig or MigDeviceConfig), got null"),
    ("GpuConfig", f"{P0}: expected an object (GpuConfig or MigDeviceConfig), "
                  "got a string"),
    ([], f"{P0}: expected an object (GpuConfig or MigDeviceConfig), got a list"),
    ({"kind": "GpuConfig"}, f"{P0}.apiVersion: missing; set apiVersion: "
                            f"{API}"),
    ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
     f"{P0}.apiVersion: 'resource.nvidia.com/v1' is not supported"),
    ({"apiVersion": API}, f"{P0}.kind: missing; use GpuConfig for full GPUs "
                          "or MigDeviceConfig for MIG devices"),
    ({"apiVersion": API, "kind": "VfioDeviceConfig"},
     f"{P0}.kind: unknown kind 'VfioDeviceConfig'"),
    ({"apiVersion": API, "kind": "GpuConfig", "replicas": 4},
     f"{P0}.replicas: unknown field; remove it (the fields here: apiVersion, "
     "kind, sharing)"),
    ({"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "replicas": 2}},
     f"{P0}.sharing.replicas: unknown field; remove it (the fields here: "
     "strategy, timeSlicingConfig, mpsConfig)"),
    ({"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS", "replicas": 2}},
     f"{P0}.sharing.replicas: unknown field; remove it (the fields here: "
     "strategy, mpsConfig)"),
    ({"apiVersion": API, "kind": "GpuConfig",
      "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": True}}},
     f"{MPS0}.multiUser: unknown field; remove it (the fields here: defaultActiveThreadPercentage, "
     "defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit)"),
    ({"apiVersion": API, "kind": "GpuConfig",
      "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short", "slice": 1}}},
     f"{P0}.sharing.timeSlicingConfig.slice: unknown field"),
    ({"apiVersion": API, "kind": "GpuConfig", "sharing": "MPS"},
     f"{P0}.sharing: expected an object, got a string"),
    ({"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": 1}},
     f"{P0}.sharing.strategy: expected a string, got a whole number; set "
     "TimeSlicing or MPS"),
    ({"apiVersion": API, "kind": "GpuConfig",
      "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": ["1Gi"]}}},
     f"{MPS0}.defaultPerDevicePinnedMemoryLimit: expected an "
     "object, got a list"),
])
def test_malformed_parameters_are_refused_with_the_field_path(parameters: Any, message: str) -> None:
    text = problem(claim(GPU0, config=[entry(parameters)]))
    assert text.startswith(message), text


def test_null_settings_read_as_absent() -> None:
    c = claim(GPU0, config=[entry(params(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": None,
                                                              "mpsConfig": None}))])
    assert one(c).interval == "Default"
    assert one(claim(GPU0, config=[entry(params(sharing=None))])) == DeviceSharing(
        source="claim config #0")


def test_malformed_entries_of_this_driver_are_refused() -> None:
    c = claim(GPU0, config=[{"requests": "gpu", "opaque": {"driver": DRIVER, "parameters": params()}}])
    assert problem(c) == "spec.devices.config[0].requests: expected a list, got a string"
    c = claim(GPU0, config=[{"requests": [1], "opaque": {"driver": DRIVER, "parameters": params()}}])
    assert problem(c).startswith("spec.devices.config[0].requests[0]: expected a string")
    assert problem(claim(GPU0, config=[{"opaque": "x"}])) == (
        "spec.devices.config[0].opaque: expected an object, got a string")
    assert problem(claim(GPU0, config=["x"])) == "spec.devices.config[0]: expected an object, got a string"


# --- devices named twice, devices not here ----------------------------------------------------------------


def test_a_device_in_two_results_gets_one_entry_when_they_agree() -> None:
    c = claim(("a", "gpu-0"), ("b", "gpu-0"), config=[timeslicing("Short")])
    assert device_sharing(c, DRIVER, T4) == {"gpu-0": DeviceSharing(strategy="TimeSlicing", interval="Short",
                                                                    source="claim config #0")}


def test_a_device_in_two_results_with_different_sharing_is_refused() -> None:
    c = claim(("a", "gpu-0"), ("b", "gpu-0"), config=[timeslicing("Short", requests=("a",)),
                                                      timeslicing("Long", requests=("b",))])
    text = problem(c)
    assert text.startswith("device gpu-0 is allocated to requests 'a' and 'b' of this claim, which "
                           "configure its sharing differently")
    assert "TimeSlicing (interval Short) from claim config #0" in text
    # per-device keys by index name each result: two limits for one device
    c = claim(("a", "gpu-0"), ("b", "gpu-0"),
              config=[mps(defaultPerDevicePinnedMemoryLimit={"0": "1Gi", "1": "2Gi"})])
    assert "has a limit under another key already" in problem(c)


def test_a_result_for_a_device_this_node_lacks_is_refused() -> None:
    text = problem(claim(("gpu", "gpu-9")))
    assert text.startswith(
        "status.allocation.devices.results[0].device: 'gpu-9' is not a device of this node")


def test_summary_reads_as_a_line() -> None:
    assert summary(DeviceSharing()) == "no sharing"
    node_sharing = DeviceSharing(strategy="TimeSlicing", source="node config")
    assert summary(node_sharing) == "TimeSlicing from node config"
    limits = MpsLimits(active_thread_percentage=25, pinned_memory_limit_mib=4096)
    assert summary(DeviceSharing(strategy="MPS", mps=limits)) == "MPS (25% threads, 4096 MiB pinned)"
