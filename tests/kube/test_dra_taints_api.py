"""Device taints on a real kube-apiserver: a down GPU stays in the node's pool with its taints (every
effect nvdp writes is accepted, re-publishing costs no write, the taints go when it recovers), and an
API server with the DRADeviceTaints gate off, which drops them, makes the publisher leave down devices
out, with one WARNING and one Warning Event on the Node."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from nvdp.daemon.report.node_events import NodeEvents
from nvdp.daemon.report.recording import Recorder
from nvdp.dra.pool.publish import TAINTS_UNSUPPORTED, SlicePublisher
from nvdp.dra.pool.slices import slice_taints_of
from nvdp.dra.pool.taints import device_health, slice_taints
from nvdp.health.ledger import Cause, Ledger, Settings
from nvdp.health.xids import describe, xid_info
from nvdp.kube import connect
from tests.kube.envtest import (
    ControlPlane,
    kube_api_without_device_taints,  # noqa: F401 (a fixture)
)
from tests.kube.test_dra_api import DRIVER, device_names, gpu, slices, unique
from tests.kube.test_dra_publish_api import events

pytestmark = pytest.mark.slow
LOG = logging.getLogger("test.dra.taints")
DEVICES = [gpu(0), gpu(1), gpu(2)]
NOW = float(int(time.time()))


def taints_for(down: dict[str, int], *, informational: dict[str, tuple[int, float]] | None = None,
               effect: str = "NoSchedule") -> dict[str, Any]:
    ledger = Ledger(Settings())
    for uuid, xid in down.items():
        ledger.fault(uuid, [uuid], Cause(describe(xid), xid_info(xid).remedy, xid), NOW)
    return slice_taints(device_health(DEVICES, ledger.record(), quiet_s=300.0, down_effect=effect,
                                      informational=informational))


def recorder_for(api: ControlPlane, node: str) -> Recorder:
    writer = NodeEvents.from_env({}, LOG, component="nvidia-dra-plugin", node_name=node,
                                 kubeconfig=str(api.admin_kubeconfig))
    assert writer is not None
    return Recorder(writer)


def test_a_down_gpu_stays_tainted_and_its_taints_go_when_it_recovers(kube_api: ControlPlane) -> None:
    node = unique("taints")
    kube_api.create_node(node)
    pub = SlicePublisher(connect(kube_api.admin_kubeconfig), node=node, driver=DRIVER, log=LOG)
    assert pub.publish(DEVICES, frozenset(), taints_for({})) == 1
    assert slice_taints_of(slices(kube_api, node)[0]) == {}
    # GPU 1: a reset XID, pods on it evicted; GPU 2: an informational XID (None).
    down = taints_for({DEVICES[1].uuid: 48}, informational={DEVICES[2].uuid: (13, NOW)}, effect="NoExecute")
    assert pub.publish(DEVICES, frozenset({DEVICES[1].uuid}), down) == 1
    (obj,) = slices(kube_api, node)
    assert device_names(kube_api, node) == ["gpu-0", "gpu-1", "gpu-2"]
    assert slice_taints_of(obj) == {name: list(t) for name, t in down.items()}  # kept as written
    assert {(t["key"], t.get("value"), t["effect"]) for t in slice_taints_of(obj)["gpu-1"]} == {
        ("gpu.nvidia.com/xid", "48", "NoExecute"), ("gpu.nvidia.com/recovery", "needs-reset", "NoExecute")}
    assert pub.taints_supported
    # The same state again: nothing to write (timeAdded is the record's, not the server's).
    version = obj["metadata"]["resourceVersion"]
    assert pub.publish(DEVICES, frozenset({DEVICES[1].uuid}), dict(down)) == 0
    assert slices(kube_api, node)[0]["metadata"]["resourceVersion"] == version
    # The record brings GPU 1 back: its taints go in the same publish.
    assert pub.publish(DEVICES, frozenset(), taints_for({}, informational={DEVICES[2].uuid: (13, NOW)})) == 1
    assert list(slice_taints_of(slices(kube_api, node)[0])) == ["gpu-2"]


def test_an_api_server_that_drops_taints_gets_down_gpus_left_out_with_one_warning_and_event(
        kube_api_without_device_taints: ControlPlane, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    api = kube_api_without_device_taints
    node = unique("notaints")
    api.create_node(node)
    recorder = recorder_for(api, node)
    pub = SlicePublisher(connect(api.admin_kubeconfig), node=node, driver=DRIVER, log=LOG, recorder=recorder)
    # Nothing tainted yet: nothing to find out.
    assert pub.publish(DEVICES, frozenset(), taints_for({})) == 1
    assert pub.taints_supported
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        # GPU 0 goes down: written tainted, read back without taints, written again without it.
        assert pub.publish(DEVICES, frozenset({DEVICES[0].uuid}), taints_for({DEVICES[0].uuid: 48})) == 2
        assert device_names(api, node) == ["gpu-1", "gpu-2"]
        assert not pub.taints_supported
        # Another GPU goes down: left out at once, no second warning.
        both = frozenset({DEVICES[0].uuid, DEVICES[1].uuid})
        assert pub.publish(DEVICES, both, taints_for({DEVICES[0].uuid: 48, DEVICES[1].uuid: 94})) == 1
        assert device_names(api, node) == ["gpu-2"]
        # Both recover: back in the pool.
        assert pub.publish(DEVICES, frozenset(), taints_for({})) == 1
        assert device_names(api, node) == ["gpu-0", "gpu-1", "gpu-2"]
    warnings = [r.getMessage() for r in caplog.records if "dropped the device taints" in r.getMessage()]
    assert len(warnings) == 1 and "DRADeviceTaints" in warnings[0]
    recorder.close()
    (event,) = events(api, "default", node, TAINTS_UNSUPPORTED)
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
    assert "DRADeviceTaints feature gate is off" in event["message"]
