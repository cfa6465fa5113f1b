"""What a starting DRA plugin keeps (nvdp.dra.claims.rebuild, ClaimPreparer.restore): prepared claims and
claim
specs are dropped only on the API server's answer that their claim is not in use; a corrupt checkpoint,
an unreachable API server or a claim that cannot be read removes nothing a running pod needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvdp.dra.claims.checkpoint import save_checkpoint
from nvdp.dra.claims.rebuild import in_use_here, orphaned_specs, released_because
from nvdp.dra.claims.records import ClaimEntry, PreparedDevice
from nvdp.kube.claims import ClaimListing, Unreadable, UnreadableClaim
from tests.dra.test_prepare import DEVICES, DRIVER, NODE, Cluster, Specs, claim, preparer, ref

DEEP = Unreadable(namespace="elsewhere", name="deep", uid="u-deep",
                  problem="ResourceClaim elsewhere/deep (uid u-deep): spec.devices.config[0].opaque."
                          "parameters is nested more than 100 levels deep, the most nvdp reads in a claim")
UNKNOWN = Unreadable(namespace="", name="", uid="", problem="ResourceClaim with unreadable metadata: ...")


def unallocated(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid}, "status": {}}


# --- the rules --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("found", "words"), [
    (None, "no such claim"),
    (claim("c", "other", "gpu-0"), "another claim under its name (uid other)"),
    (unallocated("c", "u1"), "no longer allocated"),
    (claim("c", "u1", "gpu-0", reserved=False), "reserved for no pod"),
])
def test_a_prepared_claim_is_released_on_these_answers(found: dict[str, Any] | None, words: str) -> None:
    reason = released_because(found, uid="u1")
    assert reason is not None and words in reason


def test_a_prepared_claim_reserved_for_a_pod_is_kept() -> None:
    assert released_because(claim("c", "u1", "gpu-0"), uid="u1") is None


def test_claims_in_use_here_are_reserved_and_on_this_nodes_devices() -> None:
    def results(c: dict[str, Any]) -> list[str]:
        return [r.device for r in in_use_here(c, driver=DRIVER, pool=NODE, devices=DEVICES)]

    assert results(claim("c", "u1", "gpu-1")) == ["gpu-1"]
    assert results(claim("c", "u1", "gpu-1", reserved=False)) == []
    assert results(claim("c", "u1", "gpu-1", pool="node-b")) == []
    assert results(claim("c", "u1", "gpu-7")) == []
    assert results(claim("c", "u1", "gpu-0", driver="other.example.com")) == []


def test_specs_are_orphaned_only_on_the_api_servers_answer() -> None:
    stray = {"u-running", "u-idle", "u-deleted", "u-deep"}
    claims = [claim("r", "u-running", "gpu-0"), claim("i", "u-idle", "gpu-1", reserved=False)]
    assert orphaned_specs(stray, claims, {"u-deep"}) == {
        "u-idle": "the API server has it reserved for no pod",
        "u-deleted": "the API server has no claim with this UID: it was deleted",
    }
    # A claim whose UID is unknown could be any: absence from the list proves nothing.
    assert orphaned_specs(stray, claims, {"u-deep", ""}) == {
        "u-idle": "the API server has it reserved for no pod"}
    assert orphaned_specs(stray, None, set()) == {}, "a failed list removes nothing"


# --- the start, end to end in the preparer ----------------------------------------------------------


def write_checkpoint(tmp_path: Path, *entries: ClaimEntry) -> None:
    save_checkpoint(str(tmp_path / "checkpoint.json"), {e.uid: e for e in entries})


def entry(uid: str, name: str, device: str) -> ClaimEntry:
    return ClaimEntry(uid=uid, namespace="default", name=name, state="PrepareCompleted",
                      devices=(PreparedDevice(request_names=("gpu",), pool=NODE, device=device,
                                              cdi_ids=(f"k8s.gpu.nvidia.com/claim={uid}-{device}",)),))


class Down:
    """An API server that refuses every request."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise ConnectionRefusedError(111, "Connection refused")

    def list(self) -> ClaimListing:
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_checkpointed_claim_the_api_server_has_not_is_released_and_its_gpu_prepared_again(
        tmp_path: Path) -> None:
    write_checkpoint(tmp_path, entry("ghost", "ghost", "gpu-0"), entry("u-run", "run", "gpu-1"))
    specs = Specs()
    specs.files.update({"ghost": ["gpu-0"], "u-run": ["gpu-1"]})
    new = claim("new", "u-new", "gpu-0")
    cluster = Cluster(claim("run", "u-run", "gpu-1"), new)
    p = preparer(tmp_path, cluster, specs)
    assert p.restore(cluster.list) is None
    assert set(p.prepared()) == {"u-run"}
    assert set(specs.files) == {"u-run"}
    answer = p.prepare([ref(new)])["u-new"]
    assert answer.error == "" and [d.device for d in answer.devices] == ["gpu-0"]


def test_a_holder_kept_while_the_api_server_was_down_is_released_when_its_device_is_asked_for(
        tmp_path: Path) -> None:
    write_checkpoint(tmp_path, entry("ghost", "ghost", "gpu-0"))
    specs = Specs()
    specs.files["ghost"] = ["gpu-0"]
    new = claim("new", "u-new", "gpu-0")
    cluster = Cluster(new)
    p = preparer(tmp_path, cluster, specs)
    p._get_claim = Down().get
    p.restore(Down().list)
    assert set(p.prepared()) == {"ghost"}, "no answer at start: kept"
    p._get_claim = cluster.get  # the API server is back
    answer = p.prepare([ref(new)])["u-new"]
    assert answer.error == "" and [d.device for d in answer.devices] == ["gpu-0"]
    assert set(p.prepared()) == {"u-new"} and set(specs.files) == {"u-new"}


def test_a_holder_the_api_server_still_has_in_use_keeps_its_device(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, entry("u-run", "run", "gpu-0"))
    second = claim("second", "u-2", "gpu-0")
    cluster = Cluster(claim("run", "u-run", "gpu-0"), second)
    p = preparer(tmp_path, cluster, Specs())
    p.restore(cluster.list)
    assert "already prepared for claim default/run" in p.prepare([ref(second)])["u-2"].error
    assert set(p.prepared()) == {"u-run"}


def test_a_claim_replaced_or_unreserved_while_the_plugin_was_down_is_released(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, entry("u-old", "replaced", "gpu-0"), entry("u-done", "done", "gpu-1"))
    specs = Specs()
    specs.files.update({"u-old": ["gpu-0"], "u-done": ["gpu-1"]})
    cluster = Cluster(claim("replaced", "u-newer", "gpu-0"), claim("done", "u-done", "gpu-1", reserved=False))
    p = preparer(tmp_path, cluster, specs)
    p.restore(cluster.list)
    assert p.prepared() == {} and specs.files == {}


def test_an_unreachable_api_server_releases_nothing(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, entry("u-a", "a", "gpu-0"), entry("u-b", "b", "gpu-1"))
    specs = Specs()
    specs.files.update({"u-a": ["gpu-0"], "u-b": ["gpu-1"], "u-stray": ["gpu-0"]})
    down = Down()
    p = preparer(tmp_path, Cluster(), specs)
    p._get_claim = down.get
    p.restore(down.list)
    assert set(p.prepared()) == {"u-a", "u-b"}
    assert set(specs.files) == {"u-a", "u-b", "u-stray"}, "not even a spec no claim owns"


def test_a_garbage_checkpoint_with_the_api_server_down_keeps_every_spec(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_bytes(b"\x00\x01 garbage")
    specs = Specs()
    specs.files.update({"u-a": ["gpu-0"], "u-b": ["gpu-1"]})
    down = Down()
    p = preparer(tmp_path, Cluster(), specs)
    p._get_claim = down.get
    assert p.restore(down.list) is not None
    assert p.prepared() == {}
    assert set(specs.files) == {"u-a", "u-b"}, "the running pods' specs stay"


def test_a_garbage_checkpoint_beside_an_unreadable_claim_rebuilds_the_rest(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_bytes(b"{not json")
    a, b = claim("a", "u-a", "gpu-0"), claim("b", "u-b", "gpu-1")
    specs = Specs()
    specs.files.update({"u-a": ["gpu-0"], "u-b": ["gpu-1"], "u-deep": ["gpu-0"], "u-deleted": ["gpu-0"]})
    p = preparer(tmp_path, Cluster(a, b), specs)
    p.restore(lambda: ClaimListing([a, b], (DEEP,)))
    assert set(p.prepared()) == {"u-a", "u-b"}, "both running claims rebuilt"
    assert set(specs.files) == {"u-a", "u-b", "u-deep"}, "the unreadable claim's spec kept"
    # Also when the unreadable claim's UID is not known: then no spec is proven orphaned by absence.
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "checkpoint.json").write_bytes(b"{not json")
    specs.files["u-deleted"] = ["gpu-0"]
    again = preparer(tmp_path / "again", Cluster(a, b), specs)
    again.restore(lambda: ClaimListing([a, b], (UNKNOWN,)))
    assert set(specs.files) == {"u-a", "u-b", "u-deep", "u-deleted"}


def test_a_claim_too_deep_to_read_is_refused_naming_the_field(tmp_path: Path) -> None:
    c = claim("deep", "u-deep", "gpu-0", namespace="elsewhere")

    def get(namespace: str, name: str) -> dict[str, Any] | None:
        raise UnreadableClaim(DEEP)

    p = preparer(tmp_path, Cluster(), Specs())
    p._get_claim = get
    error = p.prepare([ref(c)])["u-deep"].error
    assert error.startswith("cannot prepare ResourceClaim elsewhere/deep (uid u-deep): "
                            "spec.devices.config[0].opaque.parameters is nested more than 100 levels deep")
    assert "the kubelet retries" not in error and "create the claim again" in error
