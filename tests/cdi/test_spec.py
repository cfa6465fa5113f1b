"""The CDI records: JSON names and omissions, CDI's version table, name rules, validation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.cdi.errors import CdiError
from nvdp.cdi.spec import (
    VENDOR,
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    Spec,
    decode,
    encode,
    kind_of,
    minimum_version,
    name_problem,
    qualified,
    validate,
)
from tests.cdi.cdischema import schema_errors

NODE = DeviceNode(path="/dev/nvidia0", major=195, file_mode=0o666, permissions="rwm")


def spec(*devices: Device, common: ContainerEdits | None = None, cls: str = "gpu",
         version: str = "1.1.0") -> Spec:
    return Spec(cdi_version=version, kind=kind_of(cls), devices=devices or (device("gpu0"),),
                container_edits=common or ContainerEdits())


def device(name: str, **edits: Any) -> Device:
    return Device(name=name, container_edits=ContainerEdits(**edits) if edits else ContainerEdits(
        device_nodes=(NODE,)))


def test_json_names_order_and_omissions_follow_cdi() -> None:
    node = DeviceNode(path="/dev/nvidia1", host_path="/run/nvidia/driver/dev/nvidia1", major=195, minor=1,
                      file_mode=432, permissions="rwm", gid=44)
    hook = Hook(hook_name="createContainer", path="/usr/bin/nvidia-ctk", args=("nvidia-ctk", "hook", "x"),
                env=("NVIDIA_CTK_DEBUG=false",))
    mount = Mount(host_path="/a", container_path="/b", options=("ro",))
    edits = ContainerEdits(env=("A=1",), device_nodes=(node,), hooks=(hook,), mounts=(mount,),
                           additional_gids=(44,))
    data = encode(spec(Device(name="1", container_edits=edits), version="0.7.0"))
    assert data == (
        b'{"cdiVersion":"0.7.0","kind":"k8s.device-plugin.nvidia.com/gpu","devices":[{"name":"1",'
        b'"containerEdits":{"env":["A=1"],"deviceNodes":[{"path":"/dev/nvidia1",'
        b'"hostPath":"/run/nvidia/driver/dev/nvidia1","major":195,"minor":1,"fileMode":432,'
        b'"permissions":"rwm","gid":44}],"hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-ctk",'
        b'"args":["nvidia-ctk","hook","x"],"env":["NVIDIA_CTK_DEBUG=false"]}],"mounts":[{"hostPath":"/a",'
        b'"containerPath":"/b","options":["ro"]}],"additionalGids":[44]}}],"containerEdits":{}}'
    )
    assert decode(data) == spec(Device(name="1", container_edits=edits), version="0.7.0")


def test_zero_major_and_minor_are_left_out_as_go_leaves_them_out() -> None:
    data = json.loads(encode(spec(device("d", device_nodes=(DeviceNode(path="/dev/x", major=0, minor=0),)))))
    assert data["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/x"}]


def test_intel_rdt_clos_id_keeps_its_json_name() -> None:
    data = json.loads(encode(spec(device("d", intel_rdt=IntelRdt(clos_id="c1")))))
    assert data["devices"][0]["containerEdits"]["intelRdt"] == {"closID": "c1"}


def test_decode_refuses_unknown_fields_and_names_the_source() -> None:
    data = json.loads(encode(spec()))
    data["devices"][0]["containerEdits"]["deviceNodes"][0]["colour"] = "red"
    with pytest.raises(CdiError, match=r"/etc/cdi/x\.json: .*colour"):
        decode(json.dumps(data).encode(), "/etc/cdi/x.json")


@pytest.mark.parametrize(
    ("the_spec", "version"),
    [
        (spec(device("gpu0")), "0.3.0"),
        (spec(device("d", mounts=(Mount(host_path="/a", container_path="/a", type="bind"),))), "0.4.0"),
        (spec(device("0")), "0.5.0"),  # a name starting with a digit
        (spec(device("d", device_nodes=(replace(NODE, host_path="/dev/nvidia0"),))), "0.5.0"),
        (spec(device("d"), common=ContainerEdits(device_nodes=(replace(NODE, host_path="/x"),))), "0.5.0"),
        (replace(spec(device("d")), annotations={"a": "b"}), "0.6.0"),
        (spec(replace(device("d"), annotations={"a": "b"})), "0.6.0"),
        (spec(device("d"), cls="gpu.v2"), "0.6.0"),  # a dot in the class
        (spec(device("d", env=("A=1",), additional_gids=(44,))), "0.7.0"),
        (spec(device("d"), common=ContainerEdits(additional_gids=(44,))), "0.7.0"),
        (spec(device("d", intel_rdt=IntelRdt(clos_id="c"))), "0.7.0"),
        (spec(device("d", net_devices=(NetDevice(host_interface_name="eth0", name="e"),))), "1.1.0"),
        (spec(device("d", intel_rdt=IntelRdt(enable_monitoring=True))), "1.1.0"),
        (spec(device("d", intel_rdt=IntelRdt(schemata=("L3:0=ff",)))), "1.1.0"),
    ],
)
def test_minimum_version_follows_cdis_table(the_spec: Spec, version: str) -> None:
    assert minimum_version(the_spec) == version
    validate(replace(the_spec, cdi_version=version))


def test_a_version_below_the_minimum_is_refused() -> None:
    with pytest.raises(CdiError, match=r"cdiVersion 0\.3\.0 is below 0\.5\.0"):
        validate(spec(device("0"), version="0.3.0"))


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(CdiError, match=r"cdiVersion '0\.9\.0' is not one of"):
        validate(spec(version="0.9.0"))


@pytest.mark.parametrize(
    ("kind", "name", "valid"),
    [
        ("device", "GPU-12345678-1234-1234-1234-123456780000", True),
        ("device", "0:1", True),
        ("device", "0", True),
        ("device", "all", True),
        ("device", "a.b_c-d:e", True),
        ("device", "-a", False),
        ("device", "a:", False),
        ("device", "a/b", False),
        ("device", "", False),
        ("vendor", VENDOR, True),
        ("vendor", "1vendor.com", False),
        ("class", "imex-channel", True),
        ("class", "gpu_", False),
        ("class", "g=pu", False),
    ],
)
def test_names_follow_cdis_parser(kind: str, name: str, valid: bool) -> None:
    assert (name_problem(kind, name) is None) == valid


def test_validate_lists_every_problem() -> None:
    bad = Spec(
        cdi_version="0.7.0",
        kind="k8s.device-plugin.nvidia.com/gpu",
        devices=(
            Device(name="a", container_edits=ContainerEdits()),
            device("a"),
            device("b:", env=("NOEQUALS",), hooks=(Hook(hook_name="onStart", path=""),),
                   device_nodes=(DeviceNode(path="dev/x", type="z", permissions="rwx"),)),
        ),
        container_edits=ContainerEdits(mounts=(Mount(host_path="", container_path="/x"),)),
    )
    with pytest.raises(CdiError) as caught:
        validate(bad)
    message = str(caught.value)
    for expected in ("device 'a' has empty edits", "device 'a' appears twice", "invalid CDI device name 'b:'",
                     "invalid environment variable 'NOEQUALS'", "invalid hook name 'onStart'",
                     "hook onStart has an empty path", "path 'dev/x' is not absolute", "invalid type 'z'",
                     "invalid permissions 'rwx'", "mount '/x' lacks a path"):
        assert expected in message


def test_a_spec_without_devices_is_refused() -> None:
    with pytest.raises(CdiError, match="no devices"):
        validate(Spec(cdi_version="0.3.0", kind=kind_of("gpu"), devices=(), container_edits=ContainerEdits()))


def test_qualified_name() -> None:
    assert qualified(kind_of("gpu"), "0:1") == "k8s.device-plugin.nvidia.com/gpu=0:1"


def test_encoded_specs_pass_cdis_schema() -> None:
    hook = Hook(hook_name="createContainer", path="/usr/bin/nvidia-cdi-hook", args=("nvidia-cdi-hook", "x"))
    edits = ContainerEdits(env=("A=1",), hooks=(hook,), additional_gids=(44,),
                           mounts=(Mount(host_path="/a", container_path="/a", options=("ro",)),))
    document = json.loads(encode(spec(device("0"), device("d", **{"env": ("B=2",)}), common=edits)))
    assert schema_errors(document) == []
    document["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = "195"
    assert schema_errors(document) != []  # the schema check itself can fail
