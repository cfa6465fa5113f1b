"""DraServer over real unix sockets: a gRPC client plays the kubelet's plugin watcher and DRA manager."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.owned_socket import ServerStartError
from nvdp.dra.claims.records import ClaimRef, PreparedDevice, PrepareResult
from nvdp.dra.kubelet import server as server_module
from nvdp.dra.kubelet.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from nvdp.dra.kubelet.api import pluginregistration_v1_pb2 as reg_pb
from nvdp.dra.kubelet.api import pluginregistration_v1_pb2_grpc as reg_grpc
from nvdp.dra.kubelet.server import DraServer

DRIVER = "gpu.nvidia.com"
LOG = logging.getLogger("test-dra-server")
GPU0 = PreparedDevice(request_names=("gpu",), pool="node-a", device="gpu-0",
                      cdi_ids=("k8s.gpu.nvidia.com/claim=uid-1-gpu-0",))
GPU1 = PreparedDevice(request_names=(), pool="node-a", device="gpu-1",
                      cdi_ids=("k8s.gpu.nvidia.com/claim=uid-1-gpu-1", "other.example.com/x=y"))


class Driver:
    """The prepare/unprepare callbacks, answering from canned tables and remembering their calls."""

    def __init__(self) -> None:
        self.prepared: dict[str, PrepareResult] = {}
        self.unprepared: dict[str, str] = {}
        self.calls: list[tuple[str, list[ClaimRef]]] = []
        self.fail: Exception | None = None
        self.statuses: list[tuple[bool, str]] = []

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        self.calls.append(("prepare", list(refs)))
        if self.fail is not None:
            raise self.fail
        return {r.uid: self.prepared[r.uid] for r in refs if r.uid in self.prepared}

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        self.calls.append(("unprepare", list(refs)))
        if self.fail is not None:
            raise self.fail
        return {r.uid: self.unprepared[r.uid] for r in refs if r.uid in self.unprepared}

    def on_registered(self, registered: bool, error: str) -> None:
        self.statuses.append((registered, error))


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    # Unix socket paths must stay under ~100 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:
        yield Path(tmp) / "plugins" / DRIVER, Path(tmp) / "plugins_registry"


@pytest.fixture
def driver() -> Driver:
    return Driver()


def make_server(dirs: tuple[Path, Path], driver: Driver) -> DraServer:
    plugin_dir, registry_dir = dirs
    return DraServer(driver=DRIVER, plugin_dir=str(plugin_dir), registry_dir=str(registry_dir),
                     prepare=driver.prepare, unprepare=driver.unprepare, log=LOG,
                     on_registered=driver.on_registered)


@pytest.fixture
def server(dirs: tuple[Path, Path], driver: Driver) -> Iterator[DraServer]:
    srv = make_server(dirs, driver)
    srv.start()
    yield srv
    srv.stop()


def channel(path: str) -> Any:
    return grpc.insecure_channel(f"unix://{path}")


def call(stub_type: Any, path: str, method: str, request: Any) -> Any:
    with channel(path) as ch:
        return getattr(stub_type(ch), method)(request, timeout=5)


def claims(api: Any, *uids: str) -> list[Any]:
    return [api.Claim(namespace="ns", uid=uid, name=f"claim-{uid}") for uid in uids]


def is_socket(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(path)
    except OSError:
        return False
    return True


# --- registration ------------------------------------------------------------------------------


def test_sockets_are_where_the_kubelet_looks(server: DraServer, dirs: tuple[Path, Path]) -> None:
    plugin_dir, registry_dir = dirs
    assert server.plugin_socket == str(plugin_dir / "dra.sock")
    assert server.registration_socket == str(registry_dir / f"{DRIVER}-reg.sock")
    assert is_socket(server.plugin_socket)
    assert is_socket(server.registration_socket)
    # Only the two sockets: the private names they were bound under are gone.
    assert sorted(os.listdir(plugin_dir)) == ["dra.sock"]
    assert sorted(os.listdir(registry_dir)) == [f"{DRIVER}-reg.sock"]


def test_get_info_names_the_driver_its_endpoint_and_versions(server: DraServer) -> None:
    info = call(reg_grpc.RegistrationStub, server.registration_socket, "GetInfo", reg_pb.InfoRequest())
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == server.plugin_socket
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def test_notify_registration_status_reaches_the_callback(server: DraServer, driver: Driver) -> None:
    assert not server.registered()
    call(reg_grpc.RegistrationStub, server.registration_socket, "NotifyRegistrationStatus",
         reg_pb.RegistrationStatus(plugin_registered=True))
    assert server.registered()
    call(reg_grpc.RegistrationStub, server.registration_socket, "NotifyRegistrationStatus",
         reg_pb.RegistrationStatus(plugin_registered=False, error="version not supported"))
    assert not server.registered()
    assert driver.statuses == [(True, ""), (False, "version not supported")]


def test_a_failing_registration_callback_still_answers(dirs: tuple[Path, Path], driver: Driver) -> None:
    def broken(registered: bool, error: str) -> None:
        raise RuntimeError("boom")

    plugin_dir, registry_dir = dirs
    srv = DraServer(driver=DRIVER, plugin_dir=str(plugin_dir), registry_dir=str(registry_dir),
                    prepare=driver.prepare, unprepare=driver.unprepare, log=LOG, on_registered=broken)
    srv.start()
    try:
        call(reg_grpc.RegistrationStub, srv.registration_socket, "NotifyRegistrationStatus",
             reg_pb.RegistrationStatus(plugin_registered=True))
        assert srv.registered()
    finally:
        srv.stop()


def test_the_dra_socket_serves_before_the_registration_socket_appears(
    dirs: tuple[Path, Path], driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bool]] = []
    take_place = server_module._KubeletSocket.take_place

    def recording(self: server_module._KubeletSocket, bound: str) -> None:
        # When a socket is put in place, does the DRA socket already answer?
        seen.append((os.path.basename(self.path), is_socket(str(dirs[0] / "dra.sock"))))
        take_place(self, bound)

    monkeypatch.setattr(server_module._KubeletSocket, "take_place", recording)
    srv = make_server(dirs, driver)
    srv.start()
    try:
        assert seen == [("dra.sock", False), (f"{DRIVER}-reg.sock", True)]
    finally:
        srv.stop()


# --- prepare and unprepare ---------------------------------------------------------------------


@pytest.mark.parametrize(("api", "stub"), [(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
                                           (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub)],
                         ids=["v1", "v1beta1"])
def test_prepare_and_unprepare_round_trip(server: DraServer, driver: Driver, api: Any, stub: Any) -> None:
    driver.prepared["uid-1"] = PrepareResult(devices=(GPU0, GPU1))
    driver.unprepared["uid-1"] = ""
    response = call(stub, server.plugin_socket, "NodePrepareResources",
                    api.NodePrepareResourcesRequest(claims=claims(api, "uid-1")))
    assert list(response.claims) == ["uid-1"]
    answer = response.claims["uid-1"]
    assert answer.error == ""
    got = [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
           for d in answer.devices]
    assert got == [
        (["gpu"], "node-a", "gpu-0", ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]),
        ([], "node-a", "gpu-1", ["k8s.gpu.nvidia.com/claim=uid-1-gpu-1", "other.example.com/x=y"]),
    ]
    if api is dra_v1_pb2:
        assert not any(d.HasField("share_id") for d in answer.devices)
    else:
        assert "share_id" not in api.Device.DESCRIPTOR.fields_by_name
    assert driver.calls == [("prepare", [ClaimRef(namespace="ns", uid="uid-1", name="claim-uid-1")])]

    response = call(stub, server.plugin_socket, "NodeUnprepareResources",
                    api.NodeUnprepareResourcesRequest(claims=claims(api, "uid-1")))
    assert list(response.claims) == ["uid-1"]
    assert response.claims["uid-1"].error == ""
    assert driver.calls[-1] == ("unprepare", [ClaimRef(namespace="ns", uid="uid-1", name="claim-uid-1")])


def test_errors_are_per_claim_and_every_claim_is_answered(server: DraServer, driver: Driver) -> None:
    driver.prepared["ok"] = PrepareResult(devices=(GPU0,))
    driver.prepared["bad"] = PrepareResult(devices=(GPU1,), error="gpu-1 is unhealthy; retried")
    # "lost" gets no answer from the callback: it still gets an entry, with an error.
    response = call(dra_v1_pb2_grpc.DRAPluginStub, server.plugin_socket, "NodePrepareResources",
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(dra_v1_pb2, "ok", "bad", "lost")))
    assert sorted(response.claims) == ["bad", "lost", "ok"]
    assert response.claims["ok"].error == "" and len(response.claims["ok"].devices) == 1
    assert response.claims["bad"].error == "gpu-1 is unhealthy; retried"
    assert len(response.claims["bad"].devices) == 0  # ignored by the kubelet anyway: not sent
    assert "lost" in response.claims["lost"].error

    driver.unprepared.update({"ok": "", "bad": "cannot remove the CDI spec: read-only file system"})
    response = call(dra_v1_pb2_grpc.DRAPluginStub, server.plugin_socket, "NodeUnprepareResources",
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims(dra_v1_pb2, "ok", "bad", "lost")))
    assert sorted(response.claims) == ["bad", "lost", "ok"]
    assert response.claims["ok"].error == ""
    assert response.claims["bad"].error == "cannot remove the CDI spec: read-only file system"
    assert "lost" in response.claims["lost"].error


@pytest.mark.parametrize(("api", "stub"), [(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
                                           (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub)],
                         ids=["v1", "v1beta1"])
def test_an_exception_in_the_callback_becomes_the_claim_error(
    server: DraServer, driver: Driver, api: Any, stub: Any
) -> None:
    driver.fail = OSError("checkpoint folder is read-only")
    response = call(stub, server.plugin_socket, "NodePrepareResources",
                    api.NodePrepareResourcesRequest(claims=claims(api, "a", "b")))
    assert sorted(response.claims) == ["a", "b"]
    for uid in ("a", "b"):
        assert "checkpoint folder is read-only" in response.claims[uid].error
    response = call(stub, server.plugin_socket, "NodeUnprepareResources",
                    api.NodeUnprepareResourcesRequest(claims=claims(api, "a")))
    assert "checkpoint folder is read-only" in response.claims["a"].error


def test_an_empty_request_gets_an_empty_answer(server: DraServer) -> None:
    response = call(dra_v1_pb2_grpc.DRAPluginStub, server.plugin_socket, "NodePrepareResources",
                    dra_v1_pb2.NodePrepareResourcesRequest())
    assert len(response.claims) == 0


# --- sockets -----------------------------------------------------------------------------------


def stale_socket(path: Path) -> None:
    """A socket file nobody listens on, as a crashed instance leaves behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def test_stale_sockets_are_replaced(dirs: tuple[Path, Path], driver: Driver) -> None:
    plugin_dir, registry_dir = dirs
    stale_socket(plugin_dir / "dra.sock")
    stale_socket(registry_dir / f"{DRIVER}-reg.sock")
    assert not is_socket(str(plugin_dir / "dra.sock"))
    srv = make_server(dirs, driver)
    srv.start()
    try:
        assert srv.check_sockets()
        info = call(reg_grpc.RegistrationStub, srv.registration_socket, "GetInfo", reg_pb.InfoRequest())
        assert info.name == DRIVER
        assert is_socket(srv.plugin_socket)
    finally:
        srv.stop()


def test_a_file_in_the_way_is_an_error_naming_the_fix(dirs: tuple[Path, Path], driver: Driver) -> None:
    plugin_dir, _ = dirs
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "dra.sock").write_text("not a socket")
    srv = make_server(dirs, driver)
    with pytest.raises(ServerStartError, match=r"dra\.sock exists and is not a socket; remove it"):
        srv.start()
    srv.stop()
    assert (plugin_dir / "dra.sock").read_text() == "not a socket"


def test_check_sockets_makes_a_removed_registration_socket_again(server: DraServer, driver: Driver) -> None:
    call(reg_grpc.RegistrationStub, server.registration_socket, "NotifyRegistrationStatus",
         reg_pb.RegistrationStatus(plugin_registered=True))
    assert server.check_sockets()
    os.unlink(server.registration_socket)  # the kubelet cleaned its registry folder
    assert not server.check_sockets()
    assert server.check_sockets()
    # A new registration: the kubelet will say again whether it took it.
    assert not server.registered()
    info = call(reg_grpc.RegistrationStub, server.registration_socket, "GetInfo", reg_pb.InfoRequest())
    assert info.name == DRIVER
    # The DRA socket was not touched and still serves.
    driver.prepared["uid-1"] = PrepareResult(devices=(GPU0,))
    response = call(dra_v1_pb2_grpc.DRAPluginStub, server.plugin_socket, "NodePrepareResources",
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(dra_v1_pb2, "uid-1")))
    assert response.claims["uid-1"].devices[0].device_name == "gpu-0"


def test_check_sockets_makes_a_removed_plugin_socket_again(server: DraServer, driver: Driver) -> None:
    os.unlink(server.plugin_socket)
    assert not server.check_sockets()
    assert server.check_sockets()
    driver.unprepared["uid-1"] = ""
    response = call(dra_v1beta1_pb2_grpc.DRAPluginStub, server.plugin_socket, "NodeUnprepareResources",
                    dra_v1beta1_pb2.NodeUnprepareResourcesRequest(claims=claims(dra_v1beta1_pb2, "uid-1")))
    assert response.claims["uid-1"].error == ""


def test_stop_removes_both_sockets_and_is_safe_twice(dirs: tuple[Path, Path], driver: Driver) -> None:
    srv = make_server(dirs, driver)
    srv.start()
    srv.stop()
    assert not os.path.exists(srv.plugin_socket)
    assert not os.path.exists(srv.registration_socket)
    srv.stop()
    assert not srv.check_sockets()


def test_stop_leaves_a_socket_another_instance_took_over(dirs: tuple[Path, Path], driver: Driver) -> None:
    first = make_server(dirs, driver)
    first.start()
    second = make_server(dirs, driver)
    second.start()  # a rolling update: the new instance replaces the sockets
    try:
        assert not first.check_sockets()  # both are "taken": left to the second instance
        first.stop()
        assert is_socket(second.plugin_socket) and is_socket(second.registration_socket)
        assert second.check_sockets()
    finally:
        second.stop()


def test_start_twice_is_refused(server: DraServer) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        server.start()


# --- rolling updates: two instances side by side ----------------------------------------------------

OLD_UID = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
NEW_UID = "11111111-2222-4333-8444-555555555555"


def instance_server(dirs: tuple[Path, Path], driver: Driver, instance: str) -> DraServer:
    plugin_dir, registry_dir = dirs
    return DraServer(driver=DRIVER, plugin_dir=str(plugin_dir), registry_dir=str(registry_dir),
                     prepare=driver.prepare, unprepare=driver.unprepare, log=LOG,
                     on_registered=driver.on_registered, instance=instance)


@pytest.mark.slow
def test_two_instances_serve_side_by_side_on_sockets_named_after_their_pods(dirs: tuple[Path, Path]) -> None:
    plugin_dir, registry_dir = dirs
    plugin_dir.mkdir(parents=True)
    registry_dir.mkdir(parents=True)
    old_driver, new_driver = Driver(), Driver()
    old = instance_server(dirs, old_driver, OLD_UID)
    new = instance_server(dirs, new_driver, NEW_UID)
    old.start()
    try:
        new.start()
        try:
            assert old.plugin_socket == str(plugin_dir / f"dra-{OLD_UID}.sock")
            assert new.registration_socket == str(registry_dir / f"{DRIVER}-{NEW_UID}-reg.sock")
            # Each registration names its own endpoint; both answer.
            for srv in (old, new):
                with grpc.insecure_channel(f"unix://{srv.registration_socket}") as channel:
                    stub = server_module.registration_grpc.RegistrationStub(channel)
                    info = stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
                assert info.name == DRIVER and info.endpoint == srv.plugin_socket
            assert old.check_sockets() and new.check_sockets()
        finally:
            new.stop()
        # The new one's stop removed only its own sockets.
        assert sorted(os.listdir(plugin_dir)) == [f"dra-{OLD_UID}.sock"]
        assert sorted(os.listdir(registry_dir)) == [f"{DRIVER}-{OLD_UID}-reg.sock"]
    finally:
        old.stop()
    assert os.listdir(plugin_dir) == [] and os.listdir(registry_dir) == []


@pytest.mark.slow
def test_a_killed_instances_sockets_go_and_nobody_elses(dirs: tuple[Path, Path], driver: Driver) -> None:
    plugin_dir, registry_dir = dirs
    plugin_dir.mkdir(parents=True)
    registry_dir.mkdir(parents=True)
    dead = [plugin_dir / f"dra-{OLD_UID}.sock", registry_dir / f"{DRIVER}-{OLD_UID}-reg.sock"]
    kept = [registry_dir / f"{DRIVER}-reg.sock",  # an older plugin's fixed name: its own to remove
            registry_dir / f"{DRIVER}-other-reg.sock",  # not a pod UID: another driver's, maybe
            plugin_dir / "dra-notes.sock"]
    for path in dead + kept:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))  # bound and closed: nothing listens, as after a SIGKILL
    (plugin_dir / f"dra-{OLD_UID}.txt").write_text("not a socket\n")
    srv = instance_server(dirs, driver, NEW_UID)
    srv.start()
    try:
        assert not any(p.exists() for p in dead)
        assert all(p.exists() for p in kept) and (plugin_dir / f"dra-{OLD_UID}.txt").exists()
    finally:
        srv.stop()


def test_an_instance_name_that_is_not_a_pod_uid_is_refused() -> None:
    from nvdp.dra.main import check_start

    assert check_start(DRIVER, "node-a", NEW_UID) is None
    problem = check_start(DRIVER, "node-a", "../x")
    assert problem is not None and "--instance / POD_UID: '../x' is not a pod UID" in problem
