"""ResourceServer and KubeletSim over real unix sockets in a temporary directory."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_factories import config_with, make_inventory, replicated_resource, whole_gpu_resource
from msgspec.structs import replace

from nvdp.config.model import Config, Imex
from nvdp.daemon.owned_socket import ServerStartError
from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedResource
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.grpc_client import RegistrationError
from nvdp.plugin.preferred import PreferredAllocator
from nvdp.plugin.server import ResourceServer
from nvdp.plugin.wire import KUBELET_MAX_RECEIVE_BYTES, list_and_watch_bytes, oversized, pb_grpc
from sim.kubelet import KubeletSim, KubeletSimError

GPU = "nvidia.com/gpu"


def _server(resource: PlannedResource, config: Config, inventory: Inventory) -> ResourceServer:
    return ResourceServer(
        resource,
        config,
        inventory,
        logger=logging.getLogger("test.server"),
        dev_paths_present=lambda path: path == "/dev/nvidiactl",
        cdi_uuid=lambda: "fixed-uuid",
    )


@pytest.fixture
def served(short_tmp: Path, kubelet: KubeletSim):  # type: ignore[no-untyped-def]
    inventory = make_inventory(4, numa_split=2)
    resource = whole_gpu_resource(inventory)
    config = config_with(device_plugin_path=str(short_tmp), pass_device_specs=True)
    server = _server(resource, config, inventory)
    server.start()
    yield server, resource
    server.stop()


def test_registration_carries_the_kubelet_fields(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    [registration] = kubelet.registrations
    assert {k: registration[k] for k in ("version", "endpoint", "resource_name", "options")} == {
        "version": "v1beta1",
        "endpoint": "nvidia-gpu.sock",
        "resource_name": GPU,
        "options": {"pre_start_required": False, "get_preferred_allocation_available": True},
    }
    assert kubelet.options(GPU) == {"pre_start_required": False, "get_preferred_allocation_available": True}
    assert server.socket_path == os.path.join(kubelet.dir, "nvidia-gpu.sock")


def test_list_and_watch_sends_the_list_then_every_change(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    server.register(str(kubelet.socket_path))
    devices = kubelet.wait_for_resource(GPU, count=4, healthy=4)
    assert [d["id"] for d in devices] == [d.id for d in resource.devices]
    assert [d["numa_nodes"] for d in devices] == [[0], [0], [1], [1]]

    sick = replace(resource, devices=(replace(resource.devices[2], healthy=False), *resource.devices[3:]))
    server.update(replace(resource, devices=(*resource.devices[:2], *sick.devices)))
    devices = kubelet.wait_for_resource(GPU, count=4, healthy=3)
    assert [d["health"] for d in devices] == ["Healthy", "Healthy", "Unhealthy", "Healthy"]
    # Recovery is an update like any other.
    server.update(resource)
    kubelet.wait_for_resource(GPU, count=4, healthy=4)
    updates = [e for e in kubelet.events if e["type"] == "devices"]
    assert [sum(d["health"] == "Healthy" for d in e["devices"]) for e in updates] == [4, 3, 4]


def test_wait_delivered_returns_once_the_stream_has_sent_the_list(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    server.wait_delivered(timeout=30)  # no stream yet: at once
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4, healthy=4)
    sick = replace(resource, devices=(replace(resource.devices[0], healthy=False), *resource.devices[1:]))
    server.update(sick)
    started = time.monotonic()
    server.wait_delivered(timeout=30)
    # Well inside the timeout: the stream said it sent the list (a broken signal would wait it out).
    assert time.monotonic() - started < 10
    kubelet.wait_for_resource(GPU, count=4, healthy=3)


def test_update_refuses_another_resource(served) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    with pytest.raises(ValueError, match=r"the server for nvidia.com/gpu cannot serve nvidia.com/other"):
        server.update(replace(resource, name="nvidia.com/other"))


def test_allocate_over_grpc(served, kubelet: KubeletSim, short_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    first, second = resource.devices[0].id, resource.devices[1].id
    response = kubelet.allocate(GPU, [[first], [first, second]])
    one, two = response["container_responses"]
    assert one["envs"] == {"NVIDIA_VISIBLE_DEVICES": first}
    assert two["envs"] == {"NVIDIA_VISIBLE_DEVICES": f"{first},{second}"}
    assert two["devices"] == [
        {"container_path": "/dev/nvidiactl", "host_path": "/dev/nvidiactl", "permissions": "rw"},
        {"container_path": "/dev/nvidia0", "host_path": "/dev/nvidia0", "permissions": "rw"},
        {"container_path": "/dev/nvidia1", "host_path": "/dev/nvidia1", "permissions": "rw"},
    ]


def test_refused_allocate_is_invalid_argument_with_the_reason(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    with pytest.raises(KubeletSimError) as caught:
        kubelet.allocate(GPU, [["GPU-missing"]])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details == (
        'nvidia.com/gpu: unknown device "GPU-missing"; this node advertises '
        + ", ".join(d.id for d in resource.devices)
    )


def test_preferred_allocation_over_grpc(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    ids = [d.id for d in resource.devices]
    assert kubelet.preferred(GPU, ids, [ids[3]], 2) == [ids[3], ids[2]]
    with pytest.raises(KubeletSimError) as caught:
        kubelet.preferred(GPU, ids[:1], [], 2)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details == "nvidia.com/gpu: cannot pick 2 devices from 1 available"


def test_stop_ends_the_stream_and_removes_the_socket(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    assert os.path.exists(server.socket_path)
    server.stop()
    assert not os.path.exists(server.socket_path)
    kubelet.wait_for_disconnect(GPU)
    assert kubelet.resources() == []
    assert kubelet.events[-1]["type"] == "disconnected"
    server.stop()  # twice is fine


def test_start_replaces_a_stale_socket(short_tmp: Path, kubelet: KubeletSim) -> None:
    inventory = make_inventory(1)
    resource = whole_gpu_resource(inventory)
    config = config_with(device_plugin_path=str(short_tmp))
    # A crashed plugin leaves its socket file behind, with nobody listening.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short_tmp / "nvidia-gpu.sock"))
    stale.close()
    server = _server(resource, config, inventory)
    server.start()
    try:
        server.register(str(kubelet.socket_path))
        kubelet.wait_for_resource(GPU, count=1)
    finally:
        server.stop()


def test_start_fails_clearly_when_its_socket_does_not_accept(short_tmp: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = make_inventory(1)
    config = config_with(device_plugin_path=str(short_tmp))
    rename = os.rename

    def renamed_then_replaced(src: str, dst: str) -> None:
        rename(src, dst)
        os.unlink(dst)  # something else put a socket nobody listens on in its place
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(dst)
        dead.close()

    monkeypatch.setattr(os, "rename", renamed_then_replaced)
    server = _server(whole_gpu_resource(inventory), config, inventory)
    with pytest.raises(ServerStartError, match=r"nvidia.com/gpu does not accept connections on "
                                               r".*nvidia-gpu.sock after starting: Connection refused"):
        server.start()


def test_start_refuses_to_delete_a_regular_file(short_tmp: Path) -> None:
    inventory = make_inventory(1)
    config = config_with(device_plugin_path=str(short_tmp))
    (short_tmp / "nvidia-gpu.sock").write_text("not a socket")
    server = _server(whole_gpu_resource(inventory), config, inventory)
    with pytest.raises(ServerStartError, match=r"nvidia-gpu.sock exists and is not a socket"):
        server.start()


def test_register_without_a_kubelet_says_what_to_check(served, short_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    missing = str(short_tmp / "nowhere" / "kubelet.sock")
    with pytest.raises(RegistrationError) as caught:
        server.register(missing, timeout=0.5)
    assert str(caught.value).startswith(f"cannot register nvidia.com/gpu: no kubelet socket at {missing}; ")
    assert "devicePluginPath" in str(caught.value)


def test_register_with_a_silent_kubelet_socket_gives_up_with_the_timeout(  # type: ignore[no-untyped-def]
    served, short_tmp: Path
) -> None:
    server, _ = served
    path = str(short_tmp / "dead-kubelet.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # the file exists but nothing accepts connections
    try:
        with pytest.raises(RegistrationError) as caught:
            server.register(path, timeout=0.2)
    finally:
        dead.close()
    assert str(caught.value).startswith(
        f"cannot register nvidia.com/gpu: the kubelet did not answer on {path} within 0.2s; check that "
    )


def test_kubelet_restart_needs_a_new_registration(served, kubelet: KubeletSim) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    kubelet.restart()
    assert kubelet.resources() == []
    assert kubelet.devices(GPU) == []
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4, healthy=4)
    assert kubelet.resources() == [GPU]
    assert len(kubelet.registrations) == 2


def test_shared_resource_refusal_over_grpc(short_tmp: Path, kubelet: KubeletSim) -> None:
    inventory = make_inventory(1)
    resource = replicated_resource(inventory, 10, sharing="mps", fail_requests_greater_than_one=True)
    config = config_with(device_plugin_path=str(short_tmp), mps_root="/run/nvidia/mps")
    server = _server(resource, config, inventory)
    server.start()
    try:
        server.register(str(kubelet.socket_path))
        kubelet.wait_for_resource(GPU, count=10)
        with pytest.raises(KubeletSimError) as caught:
            kubelet.allocate(GPU, [[resource.devices[0].id, resource.devices[1].id]])
        assert caught.value.details == (
            "nvidia.com/gpu is shared (mps, 10 replicas) and allows 1 device per container; the request "
            "asked for 2. Request nvidia.com/gpu: 1, or set sharing.mps.failRequestsGreaterThanOne: false"
        )
    finally:
        server.stop()


def test_allocate_answers_follow_every_update(  # type: ignore[no-untyped-def]
    served, kubelet: KubeletSim, caplog: pytest.LogCaptureFixture
) -> None:
    """Answers are reused within a plan; an update (health, devices) must never serve an old one."""
    server, resource = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    first = resource.devices[0].id
    caplog.set_level(logging.INFO, logger="test.server")
    assert kubelet.allocate(GPU, [[first]]) == kubelet.allocate(GPU, [[first]])
    assert "unhealthy" not in caplog.text
    assert caplog.text.count(f"Allocate {GPU}: {first}") == 2  # the log line is per call, cached or not

    sick = replace(resource.devices[0], healthy=False)
    server.update(replace(resource, devices=(sick, *resource.devices[1:])))
    kubelet.allocate(GPU, [[first]])
    assert f"Allocate for {GPU} includes unhealthy devices ['{first}']" in caplog.text

    renamed = replace(resource.devices[0], id="renamed", base_id="renamed")
    server.update(replace(resource, devices=(renamed, *resource.devices[1:])))
    with pytest.raises(KubeletSimError) as refused:
        kubelet.allocate(GPU, [[first]])
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_cdi_annotation_keys_are_new_for_every_allocate(short_tmp: Path, kubelet: KubeletSim) -> None:
    inventory = make_inventory(1)
    resource = whole_gpu_resource(inventory)
    config = config_with(device_plugin_path=str(short_tmp), device_list_strategy=("cdi-annotations",))
    keys = iter(f"key-{n}" for n in range(10))
    server = ResourceServer(resource, config, inventory, cdi_uuid=lambda: next(keys))
    server.start()
    try:
        server.register(str(kubelet.socket_path))
        kubelet.wait_for_resource(GPU, count=1)
        answers = [kubelet.allocate(GPU, [[resource.devices[0].id]]) for _ in range(2)]
        assert [list(a["container_responses"][0]["annotations"]) for a in answers] == [
            ["cdi.k8s.io/nvidia-device-plugin_key-0"],
            ["cdi.k8s.io/nvidia-device-plugin_key-1"],
        ]
    finally:
        server.stop()


def test_allocate_names_the_cdi_classes_set_since(short_tmp: Path, kubelet: KubeletSim) -> None:
    """A re-plan that writes the IMEX channel spec reaches the running server: the cached answer
    without the channel is not served again, and one that loses the spec drops the name."""
    inventory = make_inventory(1)
    resource = whole_gpu_resource(inventory)
    config = replace(config_with(device_plugin_path=str(short_tmp), device_list_strategy=("cdi-cri",)),
                     imex=Imex(channel_ids=(0,)))
    server = ResourceServer(resource, config, inventory, cdi_classes=frozenset({"gpu"}))
    server.start()
    uuid = resource.devices[0].id
    gpu, channel = f"k8s.device-plugin.nvidia.com/gpu={uuid}", "k8s.device-plugin.nvidia.com/imex-channel=0"

    def names() -> list[str]:
        response = kubelet.allocate(GPU, [[uuid]])["container_responses"][0]
        return [d["name"] for d in response["cdi_devices"]]

    try:
        server.register(str(kubelet.socket_path))
        kubelet.wait_for_resource(GPU, count=1)
        assert names() == [gpu]
        server.set_cdi_classes(frozenset({"gpu", "imex-channel"}))
        assert names() == [gpu, channel]
        server.set_cdi_classes(frozenset({"gpu"}))
        assert names() == [gpu]
    finally:
        server.stop()


def test_a_device_list_too_long_for_the_kubelet_is_explained() -> None:
    inventory = make_inventory(8, numa_split=4)
    fits = replicated_resource(inventory, 1024)  # the largest a config may ask for on 8 GPUs
    assert oversized(fits) is None
    assert list_and_watch_bytes(fits) < KUBELET_MAX_RECEIVE_BYTES // 4
    many = replicated_resource(inventory, 10_000)
    reason = oversized(many)
    assert reason is not None
    size = list_and_watch_bytes(many) / 2**20
    assert reason.startswith(f"nvidia.com/gpu: its 80000 devices make a {size:.1f} MiB ListAndWatch message, "
                             "more than the 4 MiB the kubelet accepts; lower the replicas")


def test_stop_leaves_a_socket_another_instance_made(short_tmp: Path) -> None:
    """A rolling update: the new instance listens at the path before the old one exits."""
    inventory = make_inventory(1)
    config = config_with(device_plugin_path=str(short_tmp))
    old = _server(whole_gpu_resource(inventory), config, inventory)
    old.start()
    new = _server(whole_gpu_resource(inventory), config, inventory)
    new.start()  # replaces the old instance's socket file with its own
    try:
        old.stop()
        assert os.path.exists(new.socket_path)
        with grpc.insecure_channel(f"unix://{new.socket_path}") as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
    finally:
        new.stop()
    assert not os.path.exists(new.socket_path)


def test_idle_streams_do_not_starve_allocate(served) -> None:  # type: ignore[no-untyped-def]
    server, resource = served
    with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        streams = [stub.ListAndWatch(pb.Empty()) for _ in range(12)]
        opened = refused = 0
        for stream in streams:
            try:
                next(stream)
                opened += 1
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "ListAndWatch streams are open already" in str(err.details())
                refused += 1
        assert opened >= 1 and opened + refused == 12
        request = pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[resource.devices[0].id])])
        for _ in range(20):
            response = stub.Allocate(request, timeout=5)
            assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == resource.devices[0].id
        for stream in streams:
            stream.cancel()


def test_a_huge_device_id_is_cut_in_the_error(served, kubelet: KubeletSim,  # type: ignore[no-untyped-def]
                                              caplog: pytest.LogCaptureFixture) -> None:
    server, _ = served
    server.register(str(kubelet.socket_path))
    kubelet.wait_for_resource(GPU, count=4)
    huge = "GPU-" + "x" * 3_500_000
    with pytest.raises(KubeletSimError) as caught:
        kubelet.allocate(GPU, [[huge]])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f'unknown device "GPU-{"x" * 76}... (3500004 characters)"' in caught.value.details
    assert len(caught.value.details) < 1000
    assert all(len(r.getMessage()) < 2000 for r in caplog.records)


def test_allocate_logs_a_bounded_line(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    inventory = make_inventory(2)
    resource = replicated_resource(inventory, 1000)
    config = config_with(device_plugin_path=str(short_tmp))
    server = _server(resource, config, inventory)
    server.start()
    try:
        ids = [d.id for d in resource.devices[:500]]
        with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                          timeout=5)
    finally:
        server.stop()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Allocate ")]
    assert line.endswith(" and 496 more") and len(line) < 400


def test_preferred_allocation_with_many_must_include_ids(short_tmp: Path) -> None:
    inventory = make_inventory(2)
    resource = replicated_resource(inventory, 1000)
    allocator = PreferredAllocator(resource, inventory, "distributed")
    ids = [d.id for d in resource.devices]
    picked = allocator.select(ids, ids[:1000], 1001)
    assert picked[:1000] == ids[:1000] and picked[1000] in ids[1000:]
    with pytest.raises(ValueError) as caught:
        allocator.select(ids[:10], ids[10:], 2000)
    assert "and 1986 more are not among the available devices" not in str(caught.value)  # size check first
    with pytest.raises(ValueError) as caught:
        allocator.select(ids[:1990], ids[1000:], 1500)
    assert len(str(caught.value)) < 500


def test_start_in_a_file_says_it_is_not_a_directory(short_tmp: Path) -> None:
    inventory = make_inventory(1)
    (short_tmp / "plugins").write_text("")
    config = config_with(device_plugin_path=str(short_tmp / "plugins"))
    server = _server(whole_gpu_resource(inventory), config, inventory)
    with pytest.raises(ServerStartError) as caught:
        server.start()
    assert f"{short_tmp}/plugins exists but is not a directory" in str(caught.value)
    assert "Errno" not in str(caught.value)


def test_starting_is_announced_once_however_often_it_is_retried(short_tmp: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    inventory = make_inventory(1)
    (short_tmp / "nvidia-gpu.sock").write_text("not a socket")
    server = _server(whole_gpu_resource(inventory), config_with(device_plugin_path=str(short_tmp)), inventory)
    for _ in range(3):
        with pytest.raises(ServerStartError):
            server.start()
    assert caplog.messages.count("Starting GRPC server for 'nvidia.com/gpu'") == 1


def test_register_says_when_the_kubelet_removed_its_socket_meanwhile(  # type: ignore[no-untyped-def]
    served, short_tmp: Path
) -> None:
    server, _ = served
    path = short_tmp / "going-kubelet.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.listen(1)  # accepts the connection, never answers

    def remove_soon() -> None:
        time.sleep(0.2)
        path.unlink()

    remover = threading.Thread(target=remove_soon)
    remover.start()
    try:
        with pytest.raises(RegistrationError) as caught:
            server.register(str(path), timeout=1.0)
    finally:
        remover.join()
        dead.close()
    assert str(caught.value) == (
        f"cannot register nvidia.com/gpu: {path} was removed while registering (the kubelet is restarting); "
        "registering again when it is back"
    )
