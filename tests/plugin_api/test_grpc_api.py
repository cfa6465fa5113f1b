"""The committed gRPC API modules must be what their .protos generate today."""

from __future__ import annotations

from pathlib import Path

import generate_api as generate
import pytest

from nvdp.dra.kubelet.api import dra_v1_pb2 as dra_v1
from nvdp.dra.kubelet.api import dra_v1beta1_pb2 as dra_v1beta1
from nvdp.dra.kubelet.api import pluginregistration_v1_pb2 as reg
from nvdp.plugin.api import deviceplugin_pb2 as pb


def test_committed_modules_match_the_protos(tmp_path: Path) -> None:
    if generate.installed_grpc_tools_version() != generate.GRPC_TOOLS_VERSION:
        pytest.fail(
            f"grpcio-tools {generate.installed_grpc_tools_version()} installed; the staleness check needs "
            f"{generate.GRPC_TOOLS_VERSION}"
        )
    written = generate.generate(tmp_path)
    names = {fresh.relative_to(tmp_path).as_posix() for fresh in written}
    # Every proto of both API folders is covered, the DRA ones included.
    for folder, protos in generate.APIS.items():
        for proto in protos:
            assert {f"{folder}/{name}" for name in generate.generated_names(proto)} <= names
    assert "dra/kubelet/api/dra_v1beta1_pb2_grpc.py" in names
    for fresh in written:
        committed = generate.PACKAGE_DIR / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing; run: python scripts/generate_api.py"
        assert committed.read_text() == fresh.read_text(), (
            f"{committed} is stale; run: python scripts/generate_api.py"
        )


@pytest.mark.parametrize(
    ("folder", "module"),
    [
        ("plugin/api", "deviceplugin_pb2"),
        ("dra/kubelet/api", "dra_v1_pb2"),
        ("dra/kubelet/api", "dra_v1beta1_pb2"),
        ("dra/kubelet/api", "pluginregistration_v1_pb2"),
    ],
)
def test_grpc_module_imports_its_messages_relatively(folder: str, module: str) -> None:
    text = (generate.PACKAGE_DIR / folder / f"{module}_grpc.py").read_text()
    alias = module.replace("_", "__")
    assert f"from . import {module} as {alias}" in text
    assert f"\nimport {module}" not in text


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


def test_dra_wire_layout_matches_the_kubelet_api() -> None:
    assert dra_v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert dra_v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    for api in (dra_v1, dra_v1beta1):
        assert _field_numbers(api.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert _field_numbers(api.NodePrepareResourcesRequest) == {"claims": 1}
        assert _field_numbers(api.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert _field_numbers(api.NodeUnprepareResourceResponse) == {"error": 1}
        services = {s.name: [m.name for m in s.methods] for s in api.DESCRIPTOR.services_by_name.values()}
        assert services == {"DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"]}
    device = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert _field_numbers(dra_v1beta1.Device) == device
    assert _field_numbers(dra_v1.Device) == {**device, "share_id": 5}


def test_registration_wire_layout_matches_the_kubelet_api() -> None:
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert _field_numbers(reg.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert _field_numbers(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    services = {s.name: [m.name for m in s.methods] for s in reg.DESCRIPTOR.services_by_name.values()}
    assert services == {"Registration": ["GetInfo", "NotifyRegistrationStatus"]}
