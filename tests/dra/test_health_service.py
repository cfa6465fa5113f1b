"""DRAResourceHealth (nvdp.dra.kubelet.health_service) on the DRA socket of a real DraServer: a gRPC client
over
the unix socket plays the kubelet's NodeWatchResources stream, in every version the kubelet calls."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from nvdp.daemon.grpc_import import grpc
from nvdp.dra.kubelet.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2, dra_health_v1beta1_pb2
from nvdp.dra.kubelet.health_service import TIMEOUT_S, VERSIONS, HealthFeed
from nvdp.dra.kubelet.server import DraServer
from nvdp.dra.pool.devices import dra_devices
from nvdp.dra.pool.taints import device_health
from nvdp.health.ledger import Cause, Ledger, Settings
from nvdp.health.xids import describe, xid_info
from nvdp.inventory.profile import load_profile
from sim.nvml import resolve_profile

DRIVER = "gpu.nvidia.com"
POOL = "node-a"
LOG = logging.getLogger("test-dra-health")
DEVICES = dra_devices(load_profile(resolve_profile("h100-mig-8")))
API_IDS = [api.DESCRIPTOR.package for api, _ in VERSIONS]


def stub_for(api: ModuleType, ch: Any) -> Any:
    return dict(VERSIONS)[api].DRAResourceHealthStub(ch)


def health_with(gpu: str | None) -> Any:
    ledger = Ledger(Settings())
    if gpu is not None:
        ledger.fault(gpu, [gpu], Cause(describe(48), xid_info(48).remedy, 48), time.time())
    return device_health(DEVICES, ledger.record(), quiet_s=300.0)


def wait_until(check: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def feed() -> Iterator[HealthFeed]:
    fed = HealthFeed(POOL)
    fed.update(health_with(None))
    yield fed
    fed.close()


@pytest.fixture
def socket_path(feed: HealthFeed) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:
        srv = DraServer(driver=DRIVER, plugin_dir=f"{tmp}/plugins/{DRIVER}", registry_dir=f"{tmp}/reg",
                        prepare=lambda refs: {}, unprepare=lambda refs: {}, log=LOG,
                        on_registered=lambda ok, err: None, health=feed)
        srv.start()
        try:
            yield srv.plugin_socket
        finally:
            feed.close()
            srv.stop()


def by_name(response: Any) -> dict[str, Any]:
    return {d.device.device_name: d for d in response.devices}


@pytest.mark.parametrize("api", [dra_health_v1alpha1_pb2, dra_health_v1beta1_pb2, dra_health_v1_pb2],
                         ids=API_IDS)
def test_every_version_streams_every_device_then_each_change(api: ModuleType, feed: HealthFeed,
                                                            socket_path: str) -> None:
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        stream = stub_for(api, ch).NodeWatchResources(api.NodeWatchResourcesRequest(), timeout=30)
        first = by_name(next(stream))
        assert list(first) == [d.name for d in DEVICES]
        assert all(d.device.pool_name == POOL and d.health == api.HEALTHY and d.message == "healthy"
                   and d.health_check_timeout_seconds == TIMEOUT_S and d.last_updated_time > 0
                   for d in first.values())
        down = DEVICES[-1].gpu_uuid
        feed.update(health_with(down))
        second = by_name(next(stream))
        downs = {name for name, d in second.items() if d.health == api.UNHEALTHY}
        assert downs == {d.name for d in DEVICES if d.gpu_uuid == down}
        message = second[DEVICES[-1].name].message
        assert message.startswith("XID 48 (double-bit ECC error): needs a GPU reset") and len(message) < 1024
        feed.update(health_with(None))  # the record brings it back
        assert all(d.health == api.HEALTHY for d in next(stream).devices)
        stream.cancel()


def test_an_update_that_changes_nothing_sends_nothing_and_the_list_is_sent_again_in_time(
        feed: HealthFeed, socket_path: str) -> None:
    feed.resend_s = 0.3
    api = dra_health_v1alpha1_pb2
    got: list[Any] = []
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        stream = stub_for(api, ch).NodeWatchResources(api.NodeWatchResourcesRequest(), timeout=30)
        got.append(next(stream))
        feed.update(health_with(None))  # the same health
        got.append(next(stream))  # only the periodic resend
        stream.cancel()
    assert by_name(got[0]).keys() == by_name(got[1]).keys()
    assert feed.resend_s < TIMEOUT_S


def test_a_kubelet_that_goes_away_ends_its_stream_and_a_new_one_is_served(feed: HealthFeed,
                                                                          socket_path: str) -> None:
    api = dra_health_v1alpha1_pb2
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        stream = stub_for(api, ch).NodeWatchResources(api.NodeWatchResourcesRequest(), timeout=30)
        next(stream)
        wait_until(lambda: feed.streams == 1, "the stream is open")
    wait_until(lambda: feed.streams == 0, "the closed channel's stream ended")
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:  # the kubelet restarted and reconnects
        stream = stub_for(api, ch).NodeWatchResources(api.NodeWatchResourcesRequest(), timeout=30)
        assert len(next(stream).devices) == len(DEVICES)
        stream.cancel()


def test_closing_the_feed_ends_the_streams(feed: HealthFeed, socket_path: str) -> None:
    api = dra_health_v1_pb2
    ended = threading.Event()
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        stream = stub_for(api, ch).NodeWatchResources(api.NodeWatchResourcesRequest(), timeout=30)
        next(stream)

        def drain() -> None:
            for _ in stream:
                pass
            ended.set()

        threading.Thread(target=drain, daemon=True).start()
        feed.close()
        assert ended.wait(10)
    assert feed.streams == 0


def test_without_a_feed_the_health_service_is_not_served() -> None:
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:
        srv = DraServer(driver=DRIVER, plugin_dir=f"{tmp}/p", registry_dir=f"{tmp}/r",
                        prepare=lambda refs: {}, unprepare=lambda refs: {}, log=LOG,
                        on_registered=lambda ok, err: None)
        srv.start()
        try:
            api = dra_health_v1alpha1_pb2
            with grpc.insecure_channel(f"unix://{Path(srv.plugin_socket)}") as ch:
                stream = stub_for(api, ch).NodeWatchResources(api.NodeWatchResourcesRequest(), timeout=10)
                with pytest.raises(grpc.RpcError) as err:
                    next(stream)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            srv.stop()
