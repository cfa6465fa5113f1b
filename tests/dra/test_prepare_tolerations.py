"""Prepare on a tainted device: a claim whose allocation tolerates every taint the down GPU is published
with (a diagnostics pod) is prepared there; a claim that does not, or a device published without taints
(an API server without device taints), is refused as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.pool.taints import RECOVERY_KEY, XID_KEY, Taint, Toleration, tolerated
from tests.dra.test_prepare import DEVICES, DRIVER, LOG, NODE, Cluster, Specs, claim, ref

TAINTS = (Taint(XID_KEY, "NoSchedule", "48"), Taint(RECOVERY_KEY, "NoSchedule", "needs-reset"))
EXISTS_XID = {"key": XID_KEY, "operator": "Exists"}
EXISTS_RECOVERY = {"key": RECOVERY_KEY, "operator": "Exists", "effect": "NoSchedule"}


def tolerating(*tolerations: dict[str, Any]) -> dict[str, Any]:
    c = claim("diag", "ud", "gpu-0")
    c["status"]["allocation"]["devices"]["results"][0]["tolerations"] = list(tolerations)
    return c


def prepare(tmp_path: Path, c: dict[str, Any], taints: dict[str, tuple[Taint, ...]]) -> str:
    view = NodeView(DEVICES, frozenset({"GPU-0"}), taints)
    p = ClaimPreparer(driver=DRIVER, pool=NODE, checkpoint_path=str(tmp_path / "checkpoint.json"),
                      lock_path=str(tmp_path / "pu.lock"), specs=Specs(), get_claim=Cluster(c).get,
                      view=lambda: view, log=LOG)
    return p.prepare([ref(c)])[c["metadata"]["uid"]].error


def test_a_claim_tolerating_every_taint_is_prepared_on_the_down_gpu(tmp_path: Path) -> None:
    assert prepare(tmp_path, tolerating(EXISTS_XID, EXISTS_RECOVERY), {"gpu-0": TAINTS}) == ""


WRONG_XID = {"key": XID_KEY, "value": "79"}


@pytest.mark.parametrize("tolerations", [(), (EXISTS_XID,), (WRONG_XID, EXISTS_RECOVERY)])
def test_a_claim_that_does_not_tolerate_them_all_is_refused(tmp_path: Path,
                                                            tolerations: tuple[dict[str, Any], ...]) -> None:
    error = prepare(tmp_path, tolerating(*tolerations), {"gpu-0": TAINTS})
    assert "device gpu-0 is unhealthy and the claim does not tolerate its taints" in error


def test_without_published_taints_an_unhealthy_device_is_refused_whatever_the_claim(tmp_path: Path) -> None:
    error = prepare(tmp_path, tolerating({"operator": "Exists"}), {})
    assert "device gpu-0 is unhealthy" in error


def test_toleration_rules() -> None:
    taint = Taint(XID_KEY, "NoExecute", "48")
    assert Toleration(operator="Exists").tolerates(taint)  # every key
    assert Toleration(XID_KEY, "Equal", "48").tolerates(taint)
    assert not Toleration(XID_KEY, "Equal", "13").tolerates(taint)
    assert not Toleration(XID_KEY, "Exists", effect="NoSchedule").tolerates(taint)
    # None taints keep nobody off a device: nothing to tolerate.
    assert tolerated((), (Taint(XID_KEY, "None", "13"),))
