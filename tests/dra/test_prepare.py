"""Prepare and unprepare of claims (nvdp.dra.claims, nvdp.dra.state): the checks on the claim, the guards,
idempotence, the checkpoint surviving a restart, and a bad checkpoint rebuilt from the API's claims."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from nvdp.dra.claims import ClaimProblem, check_claim, our_results
from nvdp.dra.devices import DraDevice
from nvdp.dra.server import ClaimRef
from nvdp.dra.state import COMPLETED, ClaimPreparer, NodeView

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
LOG = logging.getLogger("test-dra-prepare")


def device(name: str, uuid: str, gpu_uuid: str | None = None, kind: str = "gpu") -> DraDevice:
    return DraDevice(name=name, kind=kind, uuid=uuid, gpu_uuid=gpu_uuid or uuid, attributes={}, capacity={})


DEVICES = {d.name: d for d in (device("gpu-0", "GPU-0"), device("gpu-1", "GPU-1"))}


def claim(name: str, uid: str, *devices: str, driver: str = DRIVER, pool: str = NODE,
          namespace: str = "default", reserved: bool = True, request: str = "gpu") -> dict[str, Any]:
    results = [{"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": status}


class Specs:
    """The per-claim CDI specs, in memory: what was written and removed."""

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = {}
        self.fail = False

    def write(self, claim_uid: str, devices: Sequence[DraDevice]) -> dict[str, str]:
        if self.fail:
            raise OSError("read-only file system")
        self.files[claim_uid] = [d.name for d in devices]
        return {d.name: f"k8s.gpu.nvidia.com/claim={claim_uid}-{d.name}" for d in devices}

    def remove(self, claim_uid: str) -> None:
        self.files.pop(claim_uid, None)

    def exists(self, claim_uid: str) -> bool:
        return claim_uid in self.files

    def present(self) -> frozenset[str]:
        return frozenset(self.files)


class Cluster:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.gets = 0

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.gets += 1
        return self.claims.get((namespace, name))

    def list(self) -> list[dict[str, Any]]:
        return list(self.claims.values())


def preparer(tmp_path: Path, cluster: Cluster, specs: Specs, unhealthy: frozenset[str] = frozenset()
             ) -> ClaimPreparer:
    return ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                         lock_path=str(tmp_path / "pu.lock"), specs=specs, get_claim=cluster.get,
                         view=lambda: NodeView(DEVICES, unhealthy), log=LOG)


def ref(c: dict[str, Any]) -> ClaimRef:
    meta = c["metadata"]
    return ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])


# --- the claim itself -------------------------------------------------------------------------------


def test_results_of_other_drivers_are_ignored_and_subrequests_stripped() -> None:
    c = claim("c", "u1", "gpu-0", request="gpus/large")
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth0"})
    (result,) = our_results(c, DRIVER)
    assert (result.request, result.device) == ("gpus", "gpu-0")


@pytest.mark.parametrize(("found", "uid", "words"), [
    (None, "u1", "not in the API server"),
    (claim("c", "other-uid", "gpu-0"), "u1", "was replaced"),
    ({"metadata": {"name": "c", "namespace": "default", "uid": "u1"}, "status": {}}, "u1",
     "not allocated yet"),
    (claim("c", "u1", "gpu-0", pool="node-b"), "u1", "this node's pool is 'node-a'"),
    (claim("c", "u1", "gpu-7"), "u1",
     "device gpu-7, which this node does not have (its devices: gpu-0, gpu-1)"),
])
def test_a_claim_that_cannot_be_prepared_says_why(found: dict[str, Any] | None, uid: str, words: str) -> None:
    with pytest.raises(ClaimProblem) as err:
        check_claim(found, namespace="default", name="c", uid=uid, driver=DRIVER, pool=NODE, devices=DEVICES)
    assert words in str(err.value)
    assert "claim default/c (uid u1)" in str(err.value)


# --- prepare and unprepare --------------------------------------------------------------------------


def test_prepare_writes_the_spec_and_answers_its_names(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-1")
    specs, cluster = Specs(), Cluster(c)
    answer = preparer(tmp_path, cluster, specs).prepare([ref(c)])["u1"]
    assert answer.error == ""
    (dev,) = answer.devices
    assert (dev.request_names, dev.pool, dev.device) == (("gpu",), NODE, "gpu-1")
    assert dev.cdi_ids == ("k8s.gpu.nvidia.com/claim=u1-gpu-1",)
    assert specs.files == {"u1": ["gpu-1"]}


def test_prepare_is_idempotent_without_asking_the_api_again(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs, cluster = Specs(), Cluster(c)
    p = preparer(tmp_path, cluster, specs)
    first = p.prepare([ref(c)])["u1"]
    second = p.prepare([ref(c)])["u1"]
    assert first == second and cluster.gets == 1


def test_a_device_prepared_for_another_claim_is_refused(tmp_path: Path) -> None:
    a, b = claim("a", "ua", "gpu-0"), claim("b", "ub", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(a, b), specs)
    assert p.prepare([ref(a)])["ua"].error == ""
    error = p.prepare([ref(b)])["ub"].error
    assert "device gpu-0 is already prepared for claim default/a (uid ua)" in error
    assert set(specs.files) == {"ua"}, "nothing written for the refused claim"


def test_an_unhealthy_device_is_not_handed_out(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    answer = preparer(tmp_path, Cluster(c), Specs(), frozenset({"GPU-0"})).prepare([ref(c)])["u1"]
    assert "device gpu-0 is unhealthy" in answer.error


def test_each_claim_of_a_call_gets_its_own_answer(tmp_path: Path) -> None:
    good, missing = claim("good", "ug", "gpu-0"), claim("gone", "ux", "gpu-1")
    answers = preparer(tmp_path, Cluster(good), Specs()).prepare([ref(good), ref(missing)])
    assert answers["ug"].error == "" and "not in the API server" in answers["ux"].error


def test_a_spec_that_cannot_be_written_leaves_nothing_prepared(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs = Specs()
    specs.fail = True
    p = preparer(tmp_path, Cluster(c), specs)
    assert "read-only file system" in p.prepare([ref(c)])["u1"].error
    assert p.prepared() == {}
    specs.fail = False
    assert p.prepare([ref(c)])["u1"].error == "", "the kubelet's retry succeeds"


def test_unprepare_removes_the_spec_and_frees_the_device(tmp_path: Path) -> None:
    a, b = claim("a", "ua", "gpu-0"), claim("b", "ub", "gpu-0")
    specs = Specs()
    p = preparer(tmp_path, Cluster(a, b), specs)
    p.prepare([ref(a)])
    assert p.unprepare([ref(a)]) == {"ua": ""}
    assert specs.files == {}
    assert p.prepare([ref(b)])["ub"].error == ""


def test_unprepare_of_an_unknown_claim_is_done_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    with caplog.at_level(logging.WARNING):
        answers = preparer(tmp_path, Cluster(), Specs()).unprepare([ClaimRef("default", "u9", "never")])
    assert answers == {"u9": ""}
    assert "claim default/never (uid u9), which this plugin has not prepared" in caplog.text


# --- restarts and the checkpoint --------------------------------------------------------------------


def test_prepared_claims_survive_a_restart(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs, cluster = Specs(), Cluster(c)
    first = preparer(tmp_path, cluster, specs)
    answer = first.prepare([ref(c)])["u1"]
    second = preparer(tmp_path, cluster, specs)
    assert second.restore(cluster.list) is None
    assert second.prepared()["u1"].state == COMPLETED
    assert second.prepare([ref(c)])["u1"] == answer and cluster.gets == 1


def test_a_spec_file_lost_in_a_reboot_is_written_again(tmp_path: Path) -> None:
    c = claim("c", "u1", "gpu-0")
    specs, cluster = Specs(), Cluster(c)
    preparer(tmp_path, cluster, specs).prepare([ref(c)])
    specs.files.clear()  # /var/run/cdi is a tmpfs
    again = preparer(tmp_path, cluster, specs)
    again.restore(cluster.list)
    assert again.prepare([ref(c)])["u1"].error == "" and specs.files == {"u1": ["gpu-0"]}


def test_stale_specs_are_removed_at_start(tmp_path: Path) -> None:
    specs = Specs()
    specs.files["left-over"] = ["gpu-0"]
    preparer(tmp_path, Cluster(), specs).restore(Cluster().list)
    assert specs.files == {}


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 99, "checksum": "x", "claims": {}}'])
def test_an_unreadable_checkpoint_is_set_aside_and_rebuilt_from_the_api(tmp_path: Path, content: bytes
                                                                         ) -> None:
    reserved = claim("r", "ur", "gpu-1")
    idle = claim("i", "ui", "gpu-0", reserved=False)
    other = claim("o", "uo", "gpu-0", pool="node-b")
    (tmp_path / "checkpoint.json").write_bytes(content)
    specs, cluster = Specs(), Cluster(reserved, idle, other)
    p = preparer(tmp_path, cluster, specs)
    problem = p.restore(cluster.list)
    assert problem is not None
    assert set(p.prepared()) == {"ur"}, "only the claim reserved for a pod on this node's pool"
    assert specs.files == {"ur": ["gpu-1"]}
    aside = [n for n in os.listdir(tmp_path) if n.startswith("checkpoint.json.bad-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == content, "the bad file is kept"
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert list(saved["claims"]) == ["ur"]
