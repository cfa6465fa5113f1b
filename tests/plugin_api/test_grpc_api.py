"""The committed device-plugin API modules must be what deviceplugin.proto generates today."""

from __future__ import annotations

from pathlib import Path

import generate_api as generate
import pytest

from nvdp.plugin.api import deviceplugin_pb2 as pb


def test_committed_modules_match_the_proto(tmp_path: Path) -> None:
    if generate.installed_grpc_tools_version() != generate.GRPC_TOOLS_VERSION:
        pytest.fail(
            f"grpcio-tools {generate.installed_grpc_tools_version()} installed; the staleness check needs "
            f"{generate.GRPC_TOOLS_VERSION}"
        )
    written = generate.generate(tmp_path)
    for fresh in written:
        committed = generate.API_DIR / fresh.name
        assert committed.exists(), f"{committed} is missing; run: python scripts/generate_api.py"
        assert committed.read_text() == fresh.read_text(), (
            f"{committed.name} is stale; run: python scripts/generate_api.py"
        )


def test_grpc_module_imports_its_messages_relatively() -> None:
    text = (generate.API_DIR / "deviceplugin_pb2_grpc.py").read_text()
    assert "from . import deviceplugin_pb2 as deviceplugin__pb2" in text
    assert "\nimport deviceplugin_pb2" not in text


def _field_numbers(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_wire_layout_matches_the_kubelet_api() -> None:
    # Field numbers are what the kubelet sees on the wire; these are the v1beta1 values.
    assert pb.DESCRIPTOR.package == "v1beta1"
    assert _field_numbers(pb.RegisterRequest) == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert _field_numbers(pb.DevicePluginOptions) == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }
    assert _field_numbers(pb.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert _field_numbers(pb.NUMANode) == {"ID": 1}
    assert _field_numbers(pb.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert _field_numbers(pb.ContainerPreferredAllocationResponse) == {"deviceIDs": 1}
    assert _field_numbers(pb.ContainerAllocateRequest) == {"devices_ids": 1}
    assert _field_numbers(pb.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert _field_numbers(pb.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert _field_numbers(pb.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert _field_numbers(pb.CDIDevice) == {"name": 1}
    services = {s.name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
