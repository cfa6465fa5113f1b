"""Strict MPS shares against a real kube-apiserver: the one share size a strict GPU offers is stored as
written (`requestPolicy.validValues`, resource.k8s.io/v1 DeviceCapacity) and compares equal on the next
publish, so the slice is not rewritten."""

from __future__ import annotations

import logging

import pytest
from msgspec.structs import replace

from nvdp.dra.pool.publish import SlicePublisher
from nvdp.kube import connect
from tests.kube.envtest import ControlPlane
from tests.kube.test_dra_api import DRIVER, gpu, slices, unique

pytestmark = pytest.mark.slow
LOG = logging.getLogger("test.dra.strict")
MIB = 1024 * 1024


def test_a_strict_gpus_valid_values_are_kept_and_not_rewritten(kube_api: ControlPlane) -> None:
    node = unique("strict")
    kube_api.create_node(node)
    pub = SlicePublisher(connect(kube_api.admin_kubeconfig), node=node, driver=DRIVER, log=LOG)
    strict = replace(gpu(0, memory=15360 * MIB), replicas=4, sharing="mps", strict=True,
                     resource="nvidia.com/gpu")
    loose = replace(gpu(1, memory=15360 * MIB), replicas=4, sharing="mps", resource="nvidia.com/gpu")
    assert pub.publish([strict, loose], frozenset()) == 1
    stored = {d["name"]: d for s in slices(kube_api, node) for d in s["spec"]["devices"]}
    quarter = str(15360 * MIB // 4)
    assert stored["gpu-0"]["allowMultipleAllocations"] is True
    assert stored["gpu-0"]["capacity"] == {
        "memory": {"value": str(15360 * MIB),
                   "requestPolicy": {"default": quarter, "validValues": [quarter]}},
        "replicas": {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}},
    }
    assert "validValues" not in stored["gpu-1"]["capacity"]["replicas"]["requestPolicy"]
    assert pub.publish([strict, loose], frozenset()) == 0
