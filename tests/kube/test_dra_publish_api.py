"""The slice publisher and the DRA plugin's Events against a real kube-apiserver: a foreign slice at
the top of the generation range, a refused publish recorded as one Warning Event on the Node per
failure streak, and a claim config addressed to a mistyped driver name recorded on the claim (with the
chart's RBAC, as the plugin's own token)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from nvdp.daemon.report.node_events import NodeEvents
from nvdp.daemon.report.recording import Recorder
from nvdp.dra.claims.sharing.events import CONFIG_DRIVER_MISMATCH, ClaimEvents
from nvdp.dra.claims.sharing.node import NodeSharing
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.publish import MAX_GENERATION, PUBLISH_FAILED, PublishError, SlicePublisher
from nvdp.kube import connect, create_slice, get_claim, replace_slice
from tests.kube.envtest import ControlPlane
from tests.kube.test_dra_api import (  # noqa: F401 (plane: the chart's DRA objects applied, a fixture)
    DRIVER,
    device_names,
    eventually,
    gpu,
    plane,
    pod_token_kubeconfig,
    slices,
    unique,
)

pytestmark = pytest.mark.slow
LOG = logging.getLogger("test.dra.publish")


def events(api: ControlPlane, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = api.kubectl("get", "events", "-n", namespace, "-o", "json", "--field-selector",
                          f"involvedObject.name={name},reason={reason}").stdout
    return list(json.loads(found)["items"])


def rogue_slice(node: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": [],
                     "pool": {"name": node, "generation": MAX_GENERATION, "resourceSliceCount": 1}}}


# -- the pool generation ---------------------------------------------------------------------------
def test_a_foreign_slice_at_the_top_generation_is_removed_and_publishing_goes_on(
        kube_api: ControlPlane) -> None:
    node = unique("rogue")
    kube_api.create_node(node)
    pub = SlicePublisher(connect(kube_api.admin_kubeconfig), node=node, driver=DRIVER, log=LOG)
    assert pub.publish([gpu(0)], frozenset()) == 1
    ours = f"{node}-{DRIVER}-0"
    pub.start_watch(connect(kube_api.admin_kubeconfig))
    try:
        assert pub._watcher is not None and pub._watcher.connected.wait(10)
        admin = connect(kube_api.admin_kubeconfig)
        create_slice(admin, rogue_slice(node, unique("rogue")))  # the API server takes an int64's top
        eventually(lambda: [s["metadata"]["name"] for s in slices(kube_api, node)] == [ours],
                   what="the foreign slice deleted")
        # The pool goes on: every change is published, at generations the API server accepts.
        assert pub.publish([gpu(0), gpu(1)], frozenset()) == 1
        assert device_names(kube_api, node) == ["gpu-0", "gpu-1"]
        (left,) = slices(kube_api, node)
        assert left["spec"]["pool"]["generation"] < MAX_GENERATION
        assert pub.publish([gpu(1)], frozenset()) == 1
        assert device_names(kube_api, node) == ["gpu-1"]
    finally:
        pub.stop()


def test_our_slice_set_to_the_top_generation_is_published_again_from_one(kube_api: ControlPlane) -> None:
    node = unique("topgen")
    kube_api.create_node(node)
    pub = SlicePublisher(connect(kube_api.admin_kubeconfig), node=node, driver=DRIVER, log=LOG)
    assert pub.publish([gpu(0)], frozenset()) == 1
    (ours,) = slices(kube_api, node)
    ours["spec"]["pool"]["generation"] = MAX_GENERATION
    replace_slice(connect(kube_api.admin_kubeconfig), ours)
    assert pub.publish([gpu(0), gpu(1)], frozenset()) == 1
    (written,) = slices(kube_api, node)
    assert written["spec"]["pool"]["generation"] == 1
    assert pub.publish([gpu(1)], frozenset()) == 1
    assert slices(kube_api, node)[0]["spec"]["pool"]["generation"] == 2


# -- a refused publish: a Warning Event on the Node, once per failure streak -----------------------
def invalid(minor: int, attribute: str) -> DraDevice:
    # An attribute name the API server refuses (422): every write of the slice fails.
    device = gpu(minor)
    return DraDevice(name=device.name, kind="gpu", uuid=device.uuid, gpu_uuid=device.gpu_uuid,
                     attributes={**device.attributes, attribute: {"string": "x"}}, capacity=device.capacity)


def test_a_refused_publish_records_one_warning_on_the_node_per_failure_streak(kube_api: ControlPlane) -> None:
    node = unique("refused")
    kube_api.create_node(node)
    writer = NodeEvents.from_env({}, LOG, component="nvidia-dra-plugin", node_name=node,
                                 kubeconfig=str(kube_api.admin_kubeconfig))
    assert writer is not None
    recorder = Recorder(writer)
    pub = SlicePublisher(connect(kube_api.admin_kubeconfig), node=node, driver=DRIVER, log=LOG,
                         recorder=recorder)
    for _ in range(3):  # the daemon retries every 10 s: one Event for the streak
        with pytest.raises(PublishError, match="422"):
            pub.publish([invalid(0, "bad name!")], frozenset())
    assert pub.publish([gpu(0)], frozenset()) == 1
    for _ in range(2):  # a new streak after a success: a new Event
        with pytest.raises(PublishError, match="422"):
            pub.publish([invalid(1, "also bad!")], frozenset())
    recorder.close()  # sends what is queued
    found = events(kube_api, "default", node, PUBLISH_FAILED)
    assert len(found) == 2, [e["message"] for e in found]
    for event in found:
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "Node"
        assert event["source"]["component"] == "nvidia-dra-plugin"
        assert "are not published" in event["message"] and "422" in event["message"]
    assert sorted("also bad!" in e["message"] for e in found) == [False, True]


# -- a claim config for a mistyped driver name -----------------------------------------------------
PARAMS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
          "sharing": {"strategy": "TimeSlicing"}}


def make_claim(api: ControlPlane, namespace: str, node: str, config_driver: str) -> dict[str, Any]:
    name = unique("claim")
    config = {"requests": ["gpu"], "opaque": {"driver": config_driver, "parameters": PARAMS}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                                  "config": [config]}}}
    api.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    # What the scheduler writes: the allocation, with the claim's config copied.
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node,
                                           "device": "gpu-0"}],
                              "config": [{"source": "FromClaim", **config}]}}
    api.kubectl("-n", namespace, "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"allocation": allocation}}))
    found = get_claim(connect(api.admin_kubeconfig), namespace, name)
    assert found is not None and found["status"]["allocation"]
    return found


def test_a_config_for_a_mistyped_driver_is_one_warning_event_on_the_claim(kube_api: ControlPlane) -> None:
    node, namespace = unique("typo"), unique("typo")
    kube_api.kubectl("create", "namespace", namespace)
    device = gpu(0)
    warner = ClaimEvents(connect(kube_api.admin_kubeconfig), node=node, component="nvidia-dra-plugin",
                         log=LOG)
    sharing = NodeSharing(driver=DRIVER, mps=None, log=LOG, no_mps_reason="off", warner=warner)
    mistyped = make_claim(kube_api, namespace, node, "gpu.nvidia.co")
    for _ in range(3):  # the kubelet retries a prepare that fails for another cause: one Event
        share = sharing.share_of(mistyped, {device.name: device}, [device])
        assert share.timeslices == ()  # prepared without the ignored config
    other = make_claim(kube_api, namespace, node, "compute-domain.nvidia.com")
    sharing.share_of(other, {device.name: device}, [device])
    assert warner.recorded == 1
    (event,) = events(kube_api, namespace, mistyped["metadata"]["name"], CONFIG_DRIVER_MISMATCH)
    assert event["type"] == "Warning"
    involved = event["involvedObject"]
    assert (involved["kind"], involved["apiVersion"], involved["uid"]) == (
        "ResourceClaim", "resource.k8s.io/v1", mistyped["metadata"]["uid"])
    assert event["message"].startswith(
        "spec.devices.config[0].opaque.driver is 'gpu.nvidia.co', not this driver's name 'gpu.nvidia.com'")
    assert events(kube_api, namespace, other["metadata"]["name"], CONFIG_DRIVER_MISMATCH) == []


def test_the_chart_lets_the_plugin_record_events_on_claims_in_any_namespace(
        plane: ControlPlane) -> None:  # noqa: F811 (the fixture imported above)
    node, namespace = unique("rbac"), unique("claims")
    plane.create_node(node)
    plane.kubectl("create", "namespace", namespace)
    claim = make_claim(plane, namespace, node, "gpu.nvidia.co")
    warner = ClaimEvents(connect(pod_token_kubeconfig(plane, node)), node=node, component="nvidia-dra-plugin",
                         log=LOG)
    warner.warning(claim, CONFIG_DRIVER_MISMATCH, "written with the plugin's own token")
    assert warner.recorded == 1
    (event,) = events(plane, namespace, claim["metadata"]["name"], CONFIG_DRIVER_MISMATCH)
    assert event["message"] == "written with the plugin's own token"
