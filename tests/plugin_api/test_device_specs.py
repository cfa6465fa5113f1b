"""passDeviceSpecs: the device nodes a container gets, as NVIDIA v0.20.0 lists them.

NVIDIA's list (internal/plugin/server.go apiDeviceSpecs, internal/rm/nvml_manager.go GetDevicePaths):
  1. /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-modeset, each only if
     os.Stat(<that path>) works in the plugin's own container: not under the driver root, not under
     the dev root;
  2. the requested devices' own nodes (/dev/nvidia<minor>, MIG capability nodes), not stat'ed;
  3. the IMEX channels found at start.
Each with HostPath join(flags.nvidiaDevRoot, path) and permissions "rw".
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from grpc_factories import config_with, gpu_uuid, make_inventory, whole_gpu_resource

from nvdp.plugin.allocate import CONTROL_DEVICE_PATHS, DeviceNode, allocate_container, present_control_paths
from nvdp.plugin.server import ResourceServer
from sim.kubelet import KubeletSim

G0, G1 = gpu_uuid(0), gpu_uuid(1)
GPU = "nvidia.com/gpu"


def test_control_nodes_are_looked_up_at_their_own_path_as_nvidia_does() -> None:
    # The plugin container's view: the driver root mounted at /driver-root with its own /dev, and
    # only nvidiactl and nvidia-uvm at /dev itself.
    container_fs = {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/driver-root/dev/nvidiactl",
        "/driver-root/dev/nvidia-uvm",
        "/driver-root/dev/nvidia-uvm-tools",
        "/driver-root/dev/nvidia-modeset",
        "/run/nvidia/driver/dev/nvidia-modeset",
    }
    config = config_with(
        pass_device_specs=True, container_driver_root="/driver-root", nvidia_dev_root="/run/nvidia/driver"
    )
    inventory = make_inventory(2)
    result = allocate_container(
        whole_gpu_resource(inventory),
        [G1, G0],
        config,
        dev_paths_present=present_control_paths(container_fs.__contains__).__contains__,
        mig_cap_minors=None,
        cdi_uuid=lambda: "0",
        cdi_classes=frozenset(),
    )
    # NVIDIA v0.20.0's list for this view (source facts above).
    assert result.devices == (
        DeviceNode("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        DeviceNode("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        DeviceNode("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1", "rw"),
        DeviceNode("/dev/nvidia0", "/run/nvidia/driver/dev/nvidia0", "rw"),
    )


def test_the_server_looks_for_control_nodes_in_its_own_dev_not_under_the_driver_root(
    short_tmp: Path, kubelet: KubeletSim
) -> None:
    """A driver root whose /dev holds every control node adds none that the container's /dev lacks."""
    on_this_host = [p for p in CONTROL_DEVICE_PATHS if os.path.exists(p)]
    if len(on_this_host) == len(CONTROL_DEVICE_PATHS):
        pytest.skip("this host has every control node at /dev: nothing to tell apart")
    driver_root = short_tmp / "driver-root"
    (driver_root / "dev").mkdir(parents=True)
    for path in CONTROL_DEVICE_PATHS:
        (driver_root / path.lstrip("/")).touch()
    config = config_with(
        device_plugin_path=str(short_tmp), pass_device_specs=True, container_driver_root=str(driver_root)
    )
    inventory = make_inventory(1)
    server = ResourceServer(
        whole_gpu_resource(inventory),
        config,
        inventory,
        logger=logging.getLogger("test.specs"),
        cdi_uuid=lambda: "0",
        cdi_classes=frozenset(),
    )
    server.start()
    try:
        server.register(str(kubelet.socket_path))
        kubelet.wait_for_resource(GPU, count=1)
        response = kubelet.allocate(GPU, [[G0]])
    finally:
        server.stop()
    [container] = response["container_responses"]
    paths = [d["container_path"] for d in container["devices"]]
    assert paths == [*on_this_host, "/dev/nvidia0"]
