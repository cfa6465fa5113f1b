"""The DRA plugin's metrics (NVIDIA's nvidia_dra_* series): the kubelet's calls, driven through the
servicer with the real request messages and the real ClaimPreparer, counted, timed and sorted by cause."""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import generate_latest

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.report.recording import Recorder
from nvdp.dra.claims import preparer as state_module
from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import ClaimRef, PrepareResult
from nvdp.dra.claims.sharing.gpuconfig import API_VERSION
from nvdp.dra.kubelet import server as server_module
from nvdp.dra.kubelet.api import dra_v1_pb2, dra_v1beta1_pb2
from nvdp.dra.kubelet.meter import Meter, Prepared, prepared_by_kind
from nvdp.dra.kubelet.server import DraServer, dra_v1_grpc
from nvdp.dra.pool.devices import DraDevice
from tests.dra.test_prepare import LOG, NODE, Cluster, Specs, claim, device

MIG = "gpu-2-mig-1g10gb-19-0"
DEVICES = {d.name: d for d in (device("gpu-0", "GPU-0"), device("gpu-1", "GPU-1"),
                               device(MIG, "MIG-2", "GPU-2", kind="mig"))}


@pytest.fixture
def driver() -> str:
    """A driver name of its own per test: the series live in the process's one registry."""
    return f"t{uuid.uuid4().hex[:8]}.example.com"


@pytest.fixture
def recorder() -> Recorder:
    recorder = Recorder()
    recorder.enable_metrics()
    return recorder


def series() -> ModuleType:
    from nvdp.daemon.report import metrics

    return metrics


def sample(name: str, **labels: str) -> float:
    return series().PLUGIN.get_sample_value(name, labels) or 0.0


def errors(operation: str, driver: str) -> dict[str, float]:
    """The error counters of `driver` that are not 0, by error_type."""
    name = f"nvidia_dra_node_{operation}_errors_total"
    return {s.labels["error_type"]: s.value for metric in series().PLUGIN.collect() for s in metric.samples
            if s.name == name and s.labels["driver"] == driver and s.value}


def preparer(tmp_path: Path, driver: str, cluster: Cluster, specs: Specs,
             unhealthy: frozenset[str] = frozenset()) -> ClaimPreparer:
    return ClaimPreparer(driver=driver, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=specs, get_claim=cluster.get,
                         view=lambda: NodeView(DEVICES, unhealthy), log=LOG)


def servicer(driver: str, recorder: Recorder, prepare: Any, unprepare: Any, prepared: Prepared | None = None,
             api: ModuleType = dra_v1_pb2) -> Any:
    return server_module._DraServicer(api, prepare, unprepare, LOG, Meter(recorder, driver, NODE, prepared))


def request(api: ModuleType, kind: str, *claims: dict[str, Any]) -> Any:
    metas = [c["metadata"] for c in claims]
    refs = [api.Claim(namespace=m["namespace"], uid=m["uid"], name=m["name"]) for m in metas]
    return getattr(api, f"Node{kind}ResourcesRequest")(claims=refs)


def claim_of(driver: str, name: str, uid: str, *devices: str, **kwargs: Any) -> dict[str, Any]:
    return claim(name, uid, *devices, driver=driver, **kwargs)


def with_config(c: dict[str, Any], driver: str, sharing: dict[str, Any]) -> dict[str, Any]:
    params = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}
    c["spec"] = {"devices": {"config": [{"opaque": {"driver": driver, "parameters": params}}]}}
    return c


# --- successes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", [dra_v1_pb2, dra_v1beta1_pb2], ids=["v1", "v1beta1"])
def test_prepared_claims_are_requests_timed_and_their_devices_counted_by_kind(
        tmp_path: Path, driver: str, recorder: Recorder, api: ModuleType) -> None:
    a, b = claim_of(driver, "a", "ua", "gpu-0", "gpu-1"), claim_of(driver, "b", "ub", MIG)
    p = preparer(tmp_path, driver, Cluster(a, b), Specs())
    svc = servicer(driver, recorder, p.prepare, p.unprepare, p.prepared, api)

    answer = svc.NodePrepareResources(request(api, "Prepare", a, b), None)
    assert not answer.claims["ua"].error and not answer.claims["ub"].error
    labels = {"driver": driver, "operation": "prepare"}
    assert sample("nvidia_dra_requests_total", **labels) == 2
    assert sample("nvidia_dra_request_duration_seconds_count", **labels) == 2
    assert sample("nvidia_dra_requests_inflight", **labels) == 0
    assert sample("nvidia_dra_prepared_devices", node=NODE, driver=driver, device_type="gpu") == 2
    assert sample("nvidia_dra_prepared_devices", node=NODE, driver=driver, device_type="mig") == 1
    assert errors("prepare", driver) == {}

    # The kubelet asks again (a restart, a retry): answered from the checkpoint, still two devices.
    svc.NodePrepareResources(request(api, "Prepare", a), None)
    assert sample("nvidia_dra_requests_total", **labels) == 3
    assert sample("nvidia_dra_prepared_devices", node=NODE, driver=driver, device_type="gpu") == 2

    answer = svc.NodeUnprepareResources(request(api, "Unprepare", a), None)
    assert not answer.claims["ua"].error
    assert sample("nvidia_dra_requests_total", driver=driver, operation="unprepare") == 1
    assert sample("nvidia_dra_request_duration_seconds_count", driver=driver, operation="unprepare") == 1
    assert sample("nvidia_dra_prepared_devices", node=NODE, driver=driver, device_type="gpu") == 0
    assert sample("nvidia_dra_prepared_devices", node=NODE, driver=driver, device_type="mig") == 1
    assert errors("unprepare", driver) == {}


def test_a_shared_device_counts_once_for_each_claim_and_once_within_one() -> None:
    from nvdp.dra.claims.records import PreparedDevice

    def dev(name: str, request: str) -> PreparedDevice:
        return PreparedDevice(request_names=(request,), pool=NODE, device=name, cdi_ids=())

    class Entry:
        def __init__(self, *devices: PreparedDevice) -> None:
            self.devices = devices

    claims = {"a": Entry(dev("gpu-0", "x"), dev("gpu-0", "y")), "b": Entry(dev("gpu-0", "x")),
              "c": Entry(dev(MIG, "x")), "d": Entry(dev("nic-0", "x"))}
    assert prepared_by_kind(claims) == {"gpu": 2, "mig": 1, "unknown": 1}
    assert prepared_by_kind({}) == {"gpu": 0, "mig": 0}


def test_a_kind_no_longer_prepared_reads_0(driver: str, recorder: Recorder) -> None:
    from nvdp.dra.claims.records import PreparedDevice

    class Entry:
        devices = (PreparedDevice(request_names=("x",), pool=NODE, device="nic-0", cdi_ids=()),)

    claims: dict[str, Entry] = {"a": Entry()}
    meter = Meter(recorder, driver, NODE, lambda: claims)
    meter.prepared_devices()
    assert sample("nvidia_dra_prepared_devices", node=NODE, driver=driver, device_type="unknown") == 1
    claims.clear()
    meter.prepared_devices()
    assert series().PLUGIN.get_sample_value(
        "nvidia_dra_prepared_devices", {"node": NODE, "driver": driver, "device_type": "unknown"}) == 0


def test_claims_in_flight_are_counted_while_their_call_is_answered(driver: str, recorder: Recorder) -> None:
    entered, release = threading.Event(), threading.Event()

    def prepare(refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        entered.set()
        assert release.wait(10)
        return {r.uid: PrepareResult() for r in refs}

    svc = servicer(driver, recorder, prepare, lambda refs: {})
    call = threading.Thread(target=svc.NodePrepareResources,
                            args=(request(dra_v1_pb2, "Prepare", claim("a", "ua"), claim("b", "ub")), None))
    call.start()
    try:
        assert entered.wait(10)
        assert sample("nvidia_dra_requests_inflight", driver=driver, operation="prepare") == 2
        assert sample("nvidia_dra_requests_inflight", driver=driver, operation="unprepare") == 0
    finally:
        release.set()
        call.join(10)
    assert sample("nvidia_dra_requests_inflight", driver=driver, operation="prepare") == 0
    assert sample("nvidia_dra_requests_total", driver=driver, operation="prepare") == 2


# --- failures, by cause ----------------------------------------------------------------------------


@pytest.fixture
def lock_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "LOCK_WAIT_S", 0.1)


@pytest.mark.usefixtures("lock_wait")
@pytest.mark.parametrize("case", ["claim_not_found", "invalid_claim", "invalid_config", "device_unhealthy",
                                  "device_busy", "sharing_setup", "cdi_write", "api_error", "lock_acquire"])
def test_a_failed_prepare_counts_under_its_cause_and_not_as_a_request(
        tmp_path: Path, driver: str, recorder: Recorder, case: str) -> None:
    c = claim_of(driver, "c", "uc", "gpu-0")
    cluster, specs, unhealthy = Cluster(c), Specs(), frozenset[str]()
    held: list[int] = []
    if case == "claim_not_found":
        cluster = Cluster()
    elif case == "invalid_claim":
        c = claim_of(driver, "c", "uc", "gpu-0", pool="node-b")
        cluster = Cluster(c)
    elif case == "invalid_config":
        with_config(c, driver, {"strategy": "Sometimes"})
    elif case == "device_unhealthy":
        unhealthy = frozenset({"GPU-0"})
    elif case == "device_busy":
        other = claim_of(driver, "other", "uo", "gpu-0")
        cluster = Cluster(c, other)
    elif case == "sharing_setup":  # MPS asked of a plugin that runs without it
        with_config(c, driver, {"strategy": "MPS"})
    elif case == "cdi_write":
        specs.fail = True
    elif case == "api_error":
        def unreachable(namespace: str, name: str) -> Mapping[str, Any] | None:
            raise ConnectionRefusedError("connection refused")
        cluster.get = unreachable  # type: ignore[method-assign]
    p = preparer(tmp_path, driver, cluster, specs, unhealthy)
    svc = servicer(driver, recorder, p.prepare, p.unprepare, p.prepared)
    if case == "device_busy":
        svc.NodePrepareResources(request(dra_v1_pb2, "Prepare", other), None)
    if case == "lock_acquire":  # another plugin instance (a rolling update) holds the node's lock
        fd = os.open(tmp_path / "pu.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    before = sample("nvidia_dra_requests_total", driver=driver, operation="prepare")
    try:
        answer = svc.NodePrepareResources(request(dra_v1_pb2, "Prepare", c), None)
    finally:
        for fd in held:
            os.close(fd)
    assert answer.claims["uc"].error
    assert errors("prepare", driver) == {case: 1}, answer.claims["uc"].error
    assert sample("nvidia_dra_requests_total", driver=driver, operation="prepare") == before
    assert sample("nvidia_dra_requests_inflight", driver=driver, operation="prepare") == 0


def test_a_driver_that_raises_or_forgets_a_claim_is_internal(driver: str, recorder: Recorder) -> None:
    answers = {"ok": PrepareResult(), "odd": PrepareResult(error="x", cause="free text")}

    def prepare(refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        if len(refs) == 1:
            raise RuntimeError("boom")
        return {r.uid: answers[r.uid] for r in refs if r.uid in answers}

    svc = servicer(driver, recorder, prepare, lambda refs: {})
    svc.NodePrepareResources(request(dra_v1_pb2, "Prepare", claim("a", "one")), None)
    # "odd" carries a cause outside the set; "gone" has no answer at all.
    svc.NodePrepareResources(request(dra_v1_pb2, "Prepare", claim("a", "ok"), claim("b", "odd"),
                                     claim("c", "gone")), None)
    assert errors("prepare", driver) == {"internal": 3}
    assert sample("nvidia_dra_requests_total", driver=driver, operation="prepare") == 1


def test_failed_unprepares_count_under_their_cause(tmp_path: Path, driver: str, recorder: Recorder) -> None:
    calls: list[int] = []

    def unprepare(refs: Sequence[ClaimRef]) -> dict[str, str]:
        calls.append(len(refs))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return {"ok": "", "bad": "cannot remove the CDI spec of claim x: read-only file system"}

    svc = servicer(driver, recorder, lambda refs: {}, unprepare)
    svc.NodeUnprepareResources(request(dra_v1_pb2, "Unprepare", claim("a", "ok")), None)
    svc.NodeUnprepareResources(request(dra_v1_pb2, "Unprepare", claim("a", "ok"), claim("b", "bad"),
                                       claim("c", "gone")), None)
    assert errors("unprepare", driver) == {"internal": 2, "unprepare_devices": 1}
    assert sample("nvidia_dra_requests_total", driver=driver, operation="unprepare") == 1


# --- the server and what /metrics shows ------------------------------------------------------------


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:  # unix socket paths stay short
        yield Path(tmp) / "plugins", Path(tmp) / "registry"


def test_the_server_exports_nvidias_names_labels_and_buckets(
        tmp_path: Path, dirs: tuple[Path, Path], driver: str, recorder: Recorder) -> None:
    a = claim_of(driver, "a", "ua", "gpu-0")
    p = preparer(tmp_path, driver, Cluster(a), Specs())
    server = DraServer(driver=driver, plugin_dir=str(dirs[0]), registry_dir=str(dirs[1]), prepare=p.prepare,
                       unprepare=p.unprepare, log=LOG, on_registered=lambda ok, error: None,
                       recorder=recorder, node=NODE, prepared=p.prepared)
    server.start()
    try:
        text = generate_latest(series().PLUGIN).decode()
        # Serving: the request series are there at 0 before the first call.
        assert f'nvidia_dra_requests_total{{driver="{driver}",operation="prepare"}} 0.0' in text
        assert f'nvidia_dra_requests_inflight{{driver="{driver}",operation="unprepare"}} 0.0' in text
        assert (f'nvidia_dra_prepared_devices{{device_type="gpu",driver="{driver}",node="{NODE}"}} 0.0'
                in text)
        with grpc.insecure_channel(f"unix://{server.plugin_socket}") as channel:
            answer = dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                request(dra_v1_pb2, "Prepare", a), timeout=5)
        assert not answer.claims["ua"].error
        text = generate_latest(series().PLUGIN).decode()
    finally:
        server.stop()
    for line in ("# TYPE nvidia_dra_requests_total counter",
                 "# TYPE nvidia_dra_request_duration_seconds histogram",
                 "# TYPE nvidia_dra_requests_inflight gauge",
                 "# TYPE nvidia_dra_prepared_devices gauge",
                 "# TYPE nvidia_dra_node_prepare_errors_total counter",
                 "# TYPE nvidia_dra_node_unprepare_errors_total counter",
                 f'nvidia_dra_requests_total{{driver="{driver}",operation="prepare"}} 1.0',
                 f'nvidia_dra_prepared_devices{{device_type="gpu",driver="{driver}",node="{NODE}"}} 1.0'):
        assert line in text, line
    # NVIDIA's buckets: 0.05 s doubling, nine of them.
    bounds = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("nvidia_dra_request_duration_seconds_bucket{") and f'"{driver}"' in line
              and 'operation="prepare"' in line]
    assert bounds == ["0.05", "0.1", "0.2", "0.4", "0.8", "1.6", "3.2", "6.4", "12.8", "+Inf"]


def test_without_metrics_the_server_records_nothing(tmp_path: Path, driver: str) -> None:
    recorder = Recorder()  # metrics off (no --metrics-address)
    a = claim_of(driver, "a", "ua", "gpu-0")
    p = preparer(tmp_path, driver, Cluster(a), Specs())
    svc = servicer(driver, recorder, p.prepare, p.unprepare, p.prepared)
    assert not svc.NodePrepareResources(request(dra_v1_pb2, "Prepare", a), None).claims["ua"].error
    assert sample("nvidia_dra_requests_total", driver=driver, operation="prepare") == 0
    assert not recorder.metrics_enabled


def test_device_kind_follows_the_published_names() -> None:
    from nvdp.dra.pool.names import device_kind

    devices: Mapping[str, DraDevice] = DEVICES
    assert {name: device_kind(name) for name in devices} == {"gpu-0": "gpu", "gpu-1": "gpu", MIG: "mig"}
    assert device_kind("gpu-0-mig-1g10gb-gi7-ci0") == "mig"
    assert device_kind("gpu-x") == "unknown"
