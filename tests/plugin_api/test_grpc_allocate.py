"""Allocate responses for every deviceListStrategy, ID strategy and sharing mode, and the refusals."""

from __future__ import annotations

import pytest
from grpc_factories import (
    config_with,
    gpu_uuid,
    make_gpus,
    make_inventory,
    mig_resource,
    replicated_resource,
    whole_gpu_resource,
)
from msgspec.structs import replace

from nvdp.config.model import Config, Imex
from nvdp.inventory.model import MigDevice
from nvdp.plan.model import PlannedDevice, PlannedResource
from nvdp.plugin.allocate import (
    AllocationRefused,
    ContainerAllocation,
    DeviceNode,
    MountSpec,
    allocate_container,
    parse_mig_minors,
)

G0, G1 = gpu_uuid(0), gpu_uuid(1)
GPUS = whole_gpu_resource(make_inventory(2))


def run(
    resource: PlannedResource,
    ids: list[str],
    config: Config,
    present: frozenset[str] = frozenset(),
    mig_minors: dict[str, int] | None = None,
    cdi_classes: frozenset[str] = frozenset({"gpu"}),
) -> ContainerAllocation:
    return allocate_container(
        resource,
        ids,
        config,
        dev_paths_present=present.__contains__,
        mig_cap_minors=mig_minors,
        cdi_uuid=lambda: "0b5d",
        cdi_classes=cdi_classes,
    )


def named(*ids: str) -> PlannedResource:
    """Devices with arbitrary IDs, like NVIDIA's unit tests use."""
    template = GPUS.devices[0]
    return replace(GPUS, devices=tuple(replace(template, id=i, base_id=i) for i in ids))


def test_envvar_lists_ids_once_in_request_order() -> None:
    result = run(named("foo", "bar"), ["foo", "bar", "foo"], config_with())
    assert result == ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": "foo,bar"})
    assert run(named("foo"), ["foo"], config_with()).envs == {"NVIDIA_VISIBLE_DEVICES": "foo"}


def test_index_strategy_hands_out_indices() -> None:
    result = run(GPUS, [G1, G0], config_with(device_id_strategy="index"))
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": "1,0"}


def test_volume_mounts_replace_the_env_list_with_mounts() -> None:
    result = run(GPUS, [G0, G1], config_with(device_list_strategy=("volume-mounts",)))
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert result.mounts == (
        MountSpec(f"/var/run/nvidia-container-devices/{G0}", "/dev/null"),
        MountSpec(f"/var/run/nvidia-container-devices/{G1}", "/dev/null"),
    )


def test_envvar_and_volume_mounts_together_keep_the_mount_form() -> None:
    result = run(GPUS, [G0], config_with(device_list_strategy=("envvar", "volume-mounts")))
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert result.mounts == (MountSpec(f"/var/run/nvidia-container-devices/{G0}", "/dev/null"),)


def test_cdi_annotations_only() -> None:
    config = config_with(device_list_strategy=("cdi-annotations",), pass_device_specs=True)
    result = run(GPUS, [G0, G1], config, present=frozenset({"/dev/nvidiactl"}))
    assert result == ContainerAllocation(
        annotations={
            "cdi.k8s.io/nvidia-device-plugin_0b5d": (
                f"k8s.device-plugin.nvidia.com/gpu={G0},k8s.device-plugin.nvidia.com/gpu={G1}"
            )
        }
    )


def test_cdi_annotation_prefix_is_configurable() -> None:
    config = config_with(device_list_strategy=("cdi-annotations",), cdi_annotation_prefix="custom.cdi/")
    result = run(GPUS, [G0], config)
    assert result.annotations == {
        "custom.cdi/nvidia-device-plugin_0b5d": f"k8s.device-plugin.nvidia.com/gpu={G0}"
    }


ALL_CLASSES = frozenset({"gpu", "imex-channel", "gdrcopy", "gds", "mofed"})


def test_cdi_cri_lists_devices_with_extras_and_imex_channels() -> None:
    config = replace(
        config_with(
            device_list_strategy=("cdi-cri",), gds_enabled=True, mofed_enabled=True, gdrcopy_enabled=True
        ),
        imex=Imex(channel_ids=(0,)),
    )
    result = run(GPUS, [G1], config, cdi_classes=ALL_CLASSES)
    assert result.cdi_devices == (
        f"k8s.device-plugin.nvidia.com/gpu={G1}",
        "k8s.device-plugin.nvidia.com/imex-channel=0",
        "k8s.device-plugin.nvidia.com/gdrcopy=all",
        "k8s.device-plugin.nvidia.com/gds=all",
        "k8s.device-plugin.nvidia.com/mofed=all",
    )
    # The extras are announced in the environment as well, CDI or not.
    assert result.envs == {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"}
    assert result.annotations == {}
    assert result.mounts == () and result.devices == ()


@pytest.mark.parametrize(
    ("classes", "extras"),
    [
        (frozenset({"gpu"}), []),
        (frozenset({"gpu", "gds"}), ["gds=all"]),
        (frozenset({"gpu", "imex-channel", "mofed"}), ["imex-channel=0", "mofed=all"]),
    ],
)
def test_cdi_names_only_the_optional_classes_whose_spec_was_written(classes: frozenset[str],
                                                                     extras: list[str]) -> None:
    """GDS enabled but its files missing on the node: no gds spec, so no gds name (it would not resolve),
    while NVIDIA_GDS=enabled is still set as NVIDIA sets it."""
    config = replace(
        config_with(device_list_strategy=("cdi-cri", "cdi-annotations"), gds_enabled=True, mofed_enabled=True,
                    gdrcopy_enabled=True),
        imex=Imex(channel_ids=(0,)),
    )
    result = run(GPUS, [G0], config, cdi_classes=classes)
    expected = [f"gpu={G0}", *extras]
    expected = [f"k8s.device-plugin.nvidia.com/{name}" for name in expected]
    assert list(result.cdi_devices) == expected
    assert list(result.annotations.values()) == [",".join(expected)]
    assert result.envs == {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"}


def test_cdi_with_envvar_sends_both() -> None:
    config = config_with(
        device_list_strategy=("envvar", "cdi-annotations", "cdi-cri"), device_id_strategy="index"
    )
    result = run(GPUS, [G0], config)
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": "0"}
    assert result.annotations == {
        "cdi.k8s.io/nvidia-device-plugin_0b5d": "k8s.device-plugin.nvidia.com/gpu=0"
    }
    assert result.cdi_devices == ("k8s.device-plugin.nvidia.com/gpu=0",)


def test_pass_device_specs_lists_present_control_nodes_then_gpus_under_the_dev_root() -> None:
    config = config_with(pass_device_specs=True, nvidia_driver_root="/run/nvidia/driver")
    present = frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset"})
    result = run(GPUS, [G1, G0], config, present=present)
    root = "/run/nvidia/driver"
    assert result.devices == tuple(
        DeviceNode(p, root + p)
        for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset", "/dev/nvidia1", "/dev/nvidia0")
    )
    assert {d.permissions for d in result.devices} == {"rw"}


def test_dev_root_overrides_driver_root_for_device_nodes() -> None:
    config = config_with(pass_device_specs=True, nvidia_driver_root="/run/nvidia/driver", nvidia_dev_root="/")
    assert run(GPUS, [G0], config).devices == (DeviceNode("/dev/nvidia0", "/dev/nvidia0"),)


def test_imex_channels_in_env_mounts_and_nodes() -> None:
    config = replace(
        config_with(device_list_strategy=("envvar", "volume-mounts"), pass_device_specs=True),
        imex=Imex(channel_ids=(0,)),
    )
    result = run(GPUS, [G0], config)
    assert result.envs == {
        "NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices",
        "NVIDIA_IMEX_CHANNELS": "0",
    }
    assert result.mounts[-1] == MountSpec("/var/run/nvidia-container-devices/imex/0", "/dev/null")
    assert result.devices == (
        DeviceNode("/dev/nvidia0", "/dev/nvidia0"),
        DeviceNode("/dev/nvidia-caps-imex-channels/channel0", "/dev/nvidia-caps-imex-channels/channel0"),
    )


def test_replicas_map_back_to_their_gpu_once() -> None:
    shared = replicated_resource(make_inventory(2), 4)
    result = run(shared, [f"{G0}::1", f"{G0}::3", f"{G1}::0"], config_with(pass_device_specs=True))
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": f"{G0},{G1}"}
    assert [d.container_path for d in result.devices] == ["/dev/nvidia0", "/dev/nvidia1"]


def test_mps_adds_the_pipe_directory_and_shm() -> None:
    shared = replicated_resource(make_inventory(1), 10, sharing="mps")
    result = run(shared, [f"{G0}::2"], config_with(mps_root="/run/nvidia/mps"))
    assert result.envs == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "NVIDIA_VISIBLE_DEVICES": G0,
    }
    assert result.mounts == (
        MountSpec("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        MountSpec("/dev/shm", "/run/nvidia/mps/shm"),
    )


def test_mps_without_a_root_is_refused_with_the_setting_to_fix() -> None:
    shared = replicated_resource(make_inventory(1), 2, sharing="mps")
    with pytest.raises(
        AllocationRefused, match=r"^nvidia.com/gpu is shared with MPS but flags.mpsRoot is empty"
    ):
        run(shared, [f"{G0}::0"], config_with(mps_root=""))


MIGS = (
    MigDevice("MIG-aaaa", 0, G0, 0, "1g.5gb", gi_id=7, ci_id=0, memory_bytes=5 << 30),
    MigDevice("MIG-bbbb", 1, G0, 0, "1g.5gb", gi_id=8, ci_id=0, memory_bytes=5 << 30),
)
MIG_MINORS_TEXT = """config 1
monitor 2
gpu0/gi7/access 66
gpu0/gi7/ci0/access 67
gpu0/gi8/access 75
gpu0/gi8/ci0/access 76
"""


def test_parse_mig_minors() -> None:
    assert parse_mig_minors(MIG_MINORS_TEXT) == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi7/access": 66,
        "gpu0/gi7/ci0/access": 67,
        "gpu0/gi8/access": 75,
        "gpu0/gi8/ci0/access": 76,
    }
    with pytest.raises(
        ValueError, match=r"mig-minors line 2: expected '<capability> <minor>', got 'gpu0/gi7'"
    ):
        parse_mig_minors("config 1\ngpu0/gi7\n")


def test_mig_devices_get_their_capability_nodes() -> None:
    resource = mig_resource(make_gpus(1)[0], MIGS)
    config = config_with(pass_device_specs=True)
    result = run(resource, ["MIG-bbbb", "MIG-aaaa"], config, mig_minors=parse_mig_minors(MIG_MINORS_TEXT))
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-bbbb,MIG-aaaa"}
    assert [d.container_path for d in result.devices] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap75",
        "/dev/nvidia-caps/nvidia-cap76",
        "/dev/nvidia-caps/nvidia-cap66",
        "/dev/nvidia-caps/nvidia-cap67",
    ]
    assert run(resource, ["MIG-aaaa"], config_with(device_id_strategy="index"), mig_minors=None).envs == {
        "NVIDIA_VISIBLE_DEVICES": "0:0"
    }


def test_mig_without_capability_minors_is_refused() -> None:
    resource = mig_resource(make_gpus(1)[0], MIGS)
    with pytest.raises(AllocationRefused) as caught:
        run(resource, ["MIG-aaaa"], config_with(pass_device_specs=True), mig_minors=None)
    assert str(caught.value).startswith(
        "nvidia.com/mig-1g.5gb: no capability minor for MIG device MIG-aaaa (gpu0/gi7/access) in "
        "/proc/driver/nvidia-caps/mig-minors"
    )


def test_unknown_device_names_what_the_node_advertises() -> None:
    shared = replicated_resource(make_inventory(1), 10)
    with pytest.raises(AllocationRefused) as caught:
        run(shared, [f"{G0}::11"], config_with())
    assert str(caught.value) == f'nvidia.com/gpu: unknown device "{G0}::11"; this node advertises {G0}::0..9'


def test_unknown_device_summary_is_bounded() -> None:
    many = whole_gpu_resource(make_inventory(6))
    with pytest.raises(AllocationRefused) as caught:
        run(many, ["GPU-x"], config_with())
    listed = ", ".join(gpu_uuid(i) for i in range(4))
    assert (
        str(caught.value)
        == f'nvidia.com/gpu: unknown device "GPU-x"; this node advertises {listed} and 2 more'
    )


def test_more_than_one_shared_device_is_refused_when_configured() -> None:
    shared = replicated_resource(make_inventory(1), 4, fail_requests_greater_than_one=True)
    with pytest.raises(AllocationRefused) as caught:
        run(shared, [f"{G0}::0", f"{G0}::1"], config_with())
    assert str(caught.value) == (
        "nvidia.com/gpu is shared (time-slicing, 4 replicas) and allows 1 device per container; the request "
        "asked for 2. Request nvidia.com/gpu: 1, or set sharing.timeSlicing.failRequestsGreaterThanOne: false"
    )
    assert run(shared, [f"{G0}::0"], config_with()).envs == {"NVIDIA_VISIBLE_DEVICES": G0}


def test_more_than_one_shared_device_is_allowed_by_default() -> None:
    shared = replicated_resource(make_inventory(1), 4)
    assert run(shared, [f"{G0}::0", f"{G0}::1"], config_with()).envs == {"NVIDIA_VISIBLE_DEVICES": G0}


def test_empty_request_is_refused() -> None:
    with pytest.raises(AllocationRefused, match=r"^nvidia.com/gpu: the request names no devices"):
        run(GPUS, [], config_with())


def test_unhealthy_devices_are_served_and_reported() -> None:
    sick: PlannedDevice = replace(GPUS.devices[1], healthy=False)
    resource = replace(GPUS, devices=(GPUS.devices[0], sick))
    result = run(resource, [G0, G1], config_with())
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": f"{G0},{G1}"}
    assert result.unhealthy == (G1,)
