"""A claim config addressed to a mistyped driver name: which names count as a near miss of the
driver's (nvdp.dra.claims.sharing.config_drivers.near_miss), the message naming the field, and NodeSharing
passing
it on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from nvdp.dra.claims.sharing.config_drivers import edit_distance, near_miss, near_miss_configs
from nvdp.dra.claims.sharing.events import CONFIG_DRIVER_MISMATCH
from nvdp.dra.claims.sharing.node import NodeSharing
from nvdp.dra.pool.devices import DraDevice

DRIVER = "gpu.nvidia.com"
LOG = logging.getLogger("test-claim-config-driver")
PARAMS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
          "sharing": {"strategy": "TimeSlicing"}}


@pytest.mark.parametrize(("name", "expected"), [
    ("gpu.nvidia.co", True),  # a letter dropped
    ("gpu.nvidia.comm", True),  # one added
    ("gpu.nvidai.com", True),  # two swapped
    ("gpu.nvdia.com", True),
    ("gpu.nvidia.io", True),  # two typos
    ("GPU.NVIDIA.COM", True),  # case
    ("resource.nvidia.com", True),  # the parameters' API group taken for the driver
    ("nvidia.com", True),
    (DRIVER, False),  # its own
    ("compute-domain.nvidia.com", False),  # NVIDIA's other DRA driver
    ("mig.nvidia.com", False),  # three away: a name of its own
    ("gpu.intel.com", False),
    ("gpu.amd.com", False),
    ("example.com", False),
])
def test_near_miss_of_the_default_driver(name: str, expected: bool) -> None:
    assert near_miss(name, DRIVER) is expected


def test_a_known_driver_never_warns_even_next_to_a_custom_name() -> None:
    # A plugin running as gpu2.nvidia.com beside NVIDIA's own gpu.nvidia.com: one letter apart, and
    # both real drivers; each one's configs are its own.
    assert edit_distance("gpu.nvidia.com", "gpu2.nvidia.com") == 1
    assert not near_miss("gpu.nvidia.com", "gpu2.nvidia.com")
    assert near_miss("gpu2.nvidia.co", "gpu2.nvidia.com")


def test_short_driver_names_allow_one_typo_only() -> None:
    assert near_miss("a.bd", "a.bc")
    assert not near_miss("a.de", "a.bc")


def test_edit_distance() -> None:
    assert edit_distance("", "abc") == 3
    assert edit_distance("abc", "abc") == 0
    assert edit_distance("abc", "acb") == 1  # a swap of neighbours is one edit
    assert edit_distance("kitten", "sitting") == 3


def claim(*configs: Mapping[str, Any], class_configs: tuple[Mapping[str, Any], ...] = ()) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]
    copied = [{"source": "FromClass", **c} for c in class_configs] + [
        {"source": "FromClaim", **c} for c in configs]
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {"devices": {"requests": [{"name": "gpu"}], "config": list(configs)}},
            "status": {"allocation": {"devices": {"results": results, "config": copied}}}}


def opaque(driver: str) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": PARAMS}}


def test_the_message_names_the_field_the_names_and_the_fix() -> None:
    found = near_miss_configs(claim(opaque("example.com/x"), opaque("gpu.nvidia.co")), DRIVER)
    assert found == (
        "spec.devices.config[1].opaque.driver is 'gpu.nvidia.co', not this driver's name 'gpu.nvidia.com': "
        "the config is ignored, as DRA ignores every config of another driver, and the claim is prepared "
        "without it; if it was meant for gpu.nvidia.com, correct the driver name (a claim's spec cannot "
        "change: create the claim again)",)


def test_a_device_class_config_is_named_by_its_allocation_copy() -> None:
    found = near_miss_configs(claim(class_configs=(opaque("gpu.nvidia.con"),)), DRIVER)
    assert len(found) == 1
    assert found[0].startswith("status.allocation.devices.config[0].opaque.driver is 'gpu.nvidia.con'")
    assert found[0].endswith("(in the DeviceClass the claim's request names)")


def test_other_drivers_and_odd_shapes_are_silent() -> None:
    assert near_miss_configs(claim(opaque(DRIVER), opaque("compute-domain.nvidia.com")), DRIVER) == ()
    odd = {"spec": {"devices": {"config": [None, {"opaque": "x"}, {"opaque": {"driver": 7}}, {}]}},
           "status": {"allocation": {"devices": {"config": "nope"}}}}
    assert near_miss_configs(odd, DRIVER) == ()
    assert near_miss_configs({}, DRIVER) == ()


class Warnings:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def warning(self, claim: Mapping[str, Any], reason: str, message: str) -> None:
        self.seen.append((claim["metadata"]["uid"], reason, message))


def test_node_sharing_warns_and_prepares_without_the_config() -> None:
    gpu = DraDevice(name="gpu-0", kind="gpu", uuid="GPU-0", gpu_uuid="GPU-0", attributes={}, capacity={})
    warnings = Warnings()
    sharing = NodeSharing(driver=DRIVER, mps=None, log=LOG, no_mps_reason="off", warner=warnings)
    share = sharing.share_of(claim(opaque("gpu.nvidia.co")), {"gpu-0": gpu}, [gpu])
    assert share.timeslices == ()  # the mistyped TimeSlicing config does not apply
    [(uid, reason, message)] = warnings.seen
    assert (uid, reason) == ("uid-1", CONFIG_DRIVER_MISMATCH)
    assert message.startswith("spec.devices.config[0].opaque.driver is 'gpu.nvidia.co'")
    # Spelled right, it applies, and nothing is said.
    share = sharing.share_of(claim(opaque(DRIVER)), {"gpu-0": gpu}, [gpu])
    assert share.timeslices == (("GPU-0", "Default"),)
    assert len(warnings.seen) == 1
