"""`nvdp doctor` on a node with both plugins deployed (per-node mode): the node's mode, not the mere
presence of the DRA plugin, says which API is checked, and in device-plugin mode slices of the node are
a failure (the GPUs offered twice)."""

from __future__ import annotations

import logging

import pytest

from nvdp.config.loader import load_config_text
from nvdp.config.model import Config
from nvdp.doctor.dra_check import DraNode, node_mode
from nvdp.dra.pool.devices import dra_devices
from nvdp.dra.pool.publish import SlicePublisher
from nvdp.inventory.model import Inventory
from nvdp.kube import connect
from tests.kube.envtest import ControlPlane

from .test_doctor_dra import DRIVER, Node, a100, by_check, node_name

__all__ = ["a100", "node_name"]  # fixtures
LOG = logging.getLogger("test-doctor-mode")


def config(mode: str | None) -> Config:
    return load_config_text(f"version: v1\nflags:\n  mode: {mode}\n" if mode else "version: v1\n", "e.yaml",
                            env={})


def dra_on(on: bool) -> DraNode:
    return DraNode(DRIVER, "/reg.sock", "/dra.sock", on, "test")


@pytest.mark.parametrize(("mode", "env", "on", "expected"), [
    ("dra", {}, False, "dra"),
    ("device-plugin", {"NVDP_DEFAULT_MODE": "dra"}, True, "device-plugin"),
    (None, {"NVDP_DEFAULT_MODE": "device-plugin"}, True, "device-plugin"),
    (None, {"NVDP_DEFAULT_MODE": "dra"}, False, "dra"),
    (None, {}, True, "dra"),  # a DRA plugin deployed alone, before modes: a DRA node
    (None, {}, False, "device-plugin"),
    (None, {"NVDP_DEFAULT_MODE": "bogus"}, True, "dra"),
])
def test_the_nodes_mode(mode: str | None, env: dict[str, str], on: bool, expected: str) -> None:
    assert node_mode(config(mode), env, dra_on(on)) == expected


class ModeNode(Node):
    def __init__(self, env: dict[str, str], node: str, kubeconfig: str, mode: str) -> None:
        super().__init__(env, None, node, kubeconfig)
        self.config = config(mode)


def test_device_plugin_mode_expects_no_slices(kube_api: ControlPlane, node_name: str, a100: Inventory
                                              ) -> None:
    env = {"DRA_DRIVER_NAME": DRIVER}
    doctor = ModeNode(env, node_name, str(kube_api.admin_kubeconfig), "device-plugin")
    finding = by_check(doctor.dra())["dra-slices"]
    assert finding.status == "PASS", finding
    assert finding.title == "no ResourceSlices in device-plugin mode"
    assert "the device plugin alone serves its GPUs" in finding.detail

    SlicePublisher(connect(str(kube_api.admin_kubeconfig)), node=node_name, driver=DRIVER,
                   log=LOG).publish(dra_devices(a100), frozenset())
    finding = by_check(doctor.dra())["dra-slices"]
    assert finding.status == "FAIL"
    assert "offer 8 device(s): its GPUs are offered through both APIs" in finding.detail
    assert "This node is in device-plugin mode" in finding.fix

    in_dra = by_check(ModeNode(env, node_name, str(kube_api.admin_kubeconfig), "dra").dra())["dra-slices"]
    assert in_dra.title == "this node's ResourceSlices hold its GPUs"
