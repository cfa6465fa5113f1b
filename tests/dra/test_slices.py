"""ResourceSlices for a node's DRA devices: pools, splitting, health, and the Kubernetes 1.36 schema."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from nvdp.dra.pool.devices import DraDevice, dra_devices
from nvdp.dra.pool.slices import MAX_DEVICES_PER_SLICE, desired_slices, slice_content, slice_name
from nvdp.inventory.model import Gpu, Inventory
from nvdp.inventory.profile import load_profile
from sim.nvml import list_profiles, resolve_profile

KUBERNETES = "1.36"
DRIVER = "gpu.nvidia.com"


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def profile_devices(profile: str) -> tuple[DraDevice, ...]:
    return dra_devices(load_profile(resolve_profile(profile)))


def make(devices: tuple[DraDevice, ...] | list[DraDevice], **kw: Any) -> list[dict[str, Any]]:
    args: dict[str, Any] = {"node": "node-a", "node_uid": "6f1c-uid", "driver": DRIVER, "devices": devices}
    return desired_slices(**(args | kw))


def many_gpus(n: int) -> tuple[DraDevice, ...]:
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{i:04d}", name="NVIDIA H100 80GB HBM3", memory_bytes=80 << 30,
            compute_capability=(9, 0), minor=i, pci_bus_id=f"00000000:{i % 256:02X}:00.{i // 256}")
        for i in range(n)
    )  # fmt: skip
    return dra_devices(Inventory(driver_version="570.124.06", cuda_driver_version="12.8", gpus=gpus))


@pytest.mark.parametrize("profile", list_profiles())
def test_every_profile_gives_valid_slices(profile: str) -> None:
    for obj in make(profile_devices(profile)):
        validate(obj)


def test_slice_object_shape() -> None:
    (obj,) = make(profile_devices("t4"), generation=4)
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"] == {
        "name": "node-a-gpu.nvidia.com-0",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "6f1c-uid", "controller": True}
        ],
    }
    spec = obj["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 4, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0"]


def test_no_node_uid_means_no_owner_reference() -> None:
    (obj,) = make(profile_devices("t4"), node_uid="")
    assert "ownerReferences" not in obj["metadata"]
    validate(obj)


def test_a100_and_h100_mig_slices() -> None:
    (a100,) = make(profile_devices("a100-sxm-8"))
    assert [d["name"] for d in a100["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    (h100,) = make(profile_devices("h100-mig-8"))
    names = [d["name"] for d in h100["spec"]["devices"]]
    assert names[0] == "gpu-0-mig-1g10gb-19-0" and len(names) == 28
    assert all("-mig-" in n for n in names)


def test_mixed_products_are_cel_selectable_by_product_name() -> None:
    (obj,) = make(profile_devices("mixed-4"))
    products = {d["name"]: d["attributes"]["productName"] for d in obj["spec"]["devices"]}
    # what a CEL selector `device.attributes["gpu.nvidia.com"].productName == "Tesla T4"` reads
    assert [n for n, p in products.items() if p == {"string": "Tesla T4"}] == ["gpu-0", "gpu-1"]
    assert [n for n, p in products.items() if p == {"string": "Tesla V100-SXM2-16GB"}] == ["gpu-2", "gpu-3"]


def test_unhealthy_gpus_and_mig_devices_are_left_out() -> None:
    inventory = load_profile(resolve_profile("h100-mig-8"))
    lost_gpu = inventory.gpus[1]
    bad_mig = inventory.gpus[0].mig_devices[2]
    (obj,) = make(dra_devices(inventory), unhealthy=frozenset({lost_gpu.uuid, bad_mig.uuid}))
    names = [d["name"] for d in obj["spec"]["devices"]]
    assert not any(n.startswith("gpu-1-") for n in names)
    assert "gpu-0-mig-1g10gb-19-2" not in names and "gpu-0-mig-1g10gb-19-1" in names
    assert len(names) == 28 - len(lost_gpu.mig_devices) - 1


def test_no_devices_still_gives_one_empty_slice() -> None:
    (obj,) = make([])
    assert obj["spec"]["devices"] == [] and obj["spec"]["pool"]["resourceSliceCount"] == 1
    validate(obj)
    (all_bad,) = make(profile_devices("t4"), unhealthy=frozenset({profile_devices("t4")[0].uuid}))
    assert all_bad["spec"]["devices"] == []


@pytest.mark.parametrize(("n", "count"), [(128, 1), (129, 2), (300, 3)])
def test_more_than_128_devices_are_split(n: int, count: int) -> None:
    devices = many_gpus(n)
    objs = make(devices, generation=2)
    assert len(objs) == count
    assert [o["metadata"]["name"] for o in objs] == [f"node-a-gpu.nvidia.com-{i}" for i in range(count)]
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {count}
    assert {o["spec"]["pool"]["generation"] for o in objs} == {2}
    assert all(len(o["spec"]["devices"]) <= MAX_DEVICES_PER_SLICE for o in objs)
    published = [d["name"] for o in objs for d in o["spec"]["devices"]]
    assert published == [d.name for d in devices]
    for obj in objs:
        validate(obj)


def test_long_names_are_cut_to_a_valid_unique_name() -> None:
    node = ".".join(["n" * 60] * 4)  # 243 characters, a valid node name
    names = {slice_name(node, DRIVER, i) for i in range(3)}
    assert len(names) == 3 and all(len(n) <= 253 for n in names)
    assert slice_name("node-a", DRIVER, 0) == "node-a-gpu.nvidia.com-0"
    for obj in make(many_gpus(200), node=node):
        validate(obj)


def test_slice_content_ignores_generation_and_server_forms() -> None:
    (desired,) = make(profile_devices("h100-mig-8"), generation=1)
    (listed,) = make(profile_devices("h100-mig-8"), generation=7)
    listed["metadata"]["resourceVersion"] = "12345"
    device = listed["spec"]["devices"][0]
    device["capacity"]["memory"] = {"value": "10223616Ki"}  # the same bytes, written as the server may
    assert slice_content(desired) == slice_content(listed)
    device["capacity"]["memory"] = {"value": "1Ki"}
    assert slice_content(desired) != slice_content(listed)


def test_slice_content_sees_device_and_count_changes() -> None:
    devices = profile_devices("a100-sxm-8")
    (full,) = make(devices)
    (fewer,) = make(devices, unhealthy=frozenset({devices[0].uuid}))
    assert slice_content(full) != slice_content(fewer)
    assert slice_content(make(many_gpus(129))[0]) != slice_content(make(many_gpus(128))[0])
