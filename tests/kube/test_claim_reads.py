"""Claims read from the API server one by one: a claim nested too deeply to decode is reported by name,
field and limit and skipped, never the failure of the whole list (nvdp.kube.claims, nvdp.kube.jsonshape);
and a DRA plugin start against a real kube-apiserver that holds such a claim keeps the running claims."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.kube import connect
from nvdp.kube.claims import MAX_DEPTH, ClaimListing, UnreadableClaim, decode_claim, get_claim, list_claims
from nvdp.kube.jsonshape import NotJson, outline
from tests.dra.test_prepare import DEVICES, Specs
from tests.kube.envtest import ControlPlane

DRIVER = "gpu.nvidia.com"
DEEP = 1500  # what a user can store: the API server takes it
LOG = logging.getLogger("test-claim-reads")
GPU_CONFIG = '{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}'


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def nested(depth: int) -> Any:
    value: Any = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def deep_json(depth: int) -> str:
    # Built as text: json.dumps itself recurses and gives up past a thousand levels.
    return '{"a":' * (depth - 1) + '{"leaf":1}' + "}" * (depth - 1)


def claim_json(namespace: str, name: str, parameters: str = GPU_CONFIG) -> str:
    return ('{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",'
            f'"metadata":{{"name":"{name}","namespace":"{namespace}","uid":"uid-{name}"}},'
            '"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.nvidia.com"}}],'
            f'"config":[{{"opaque":{{"driver":"{DRIVER}","parameters":{parameters}}}}}]}}}}}}')


# --- the outline and one claim, without an API server -----------------------------------------------


def test_a_deep_document_is_outlined_without_recursion() -> None:
    metadata = {"name": "x", "tricky": 'a\\"}]{,'}  # brackets and an escaped quote inside a string
    raw = f'{{"metadata":{json.dumps(metadata)},"spec":{deep_json(DEEP)}}}'.encode()
    with pytest.raises(RecursionError):
        msgspec.json.decode(raw)  # what the list decoder did
    shape = outline(raw, 10)
    assert set(shape.members) == {"metadata", "spec"}
    start, end = shape.members["metadata"]
    assert msgspec.json.decode(raw[start:end]) == metadata
    # The root is depth 1: the first object past 10 is at depth 11, 10 steps from the root.
    assert shape.too_deep_at == ("spec",) + ("a",) * 9


@pytest.mark.parametrize("raw", [b"{", b"[1, 2", b'{"a": [1}', b"}"])
def test_unbalanced_json_is_refused(raw: bytes) -> None:
    with pytest.raises(NotJson):
        outline(raw, 10)


def test_a_claim_within_the_limit_is_decoded_whole() -> None:
    raw = claim_json("team-a", "ok", json.dumps(nested(MAX_DEPTH - 10))).encode()
    found = decode_claim(raw)
    assert isinstance(found, dict) and found["metadata"]["name"] == "ok"


def test_a_claim_past_the_limit_names_the_claim_the_field_and_the_limit() -> None:
    found = decode_claim(claim_json("team-b", "deep", deep_json(DEEP)).encode())
    assert not isinstance(found, dict)
    assert (found.namespace, found.name, found.uid) == ("team-b", "deep", "uid-deep")
    assert found.problem == (
        "ResourceClaim team-b/deep (uid uid-deep): spec.devices.config[0].opaque.parameters is nested more "
        f"than {MAX_DEPTH} levels deep, the most nvdp reads in a claim")


def test_a_claim_that_is_not_json_is_reported_not_raised() -> None:
    found = decode_claim(b'{"metadata": {"name": "x", "namespace": "n", "uid": "u"}, "spec": tru}')
    assert not isinstance(found, dict)
    assert found.problem.startswith("ResourceClaim n/x (uid u): is not valid JSON")


# --- against a real kube-apiserver ------------------------------------------------------------------

def create(plane: ControlPlane, text: str) -> dict[str, Any]:
    """Create the claim; its namespace, name and the UID the API server gave it."""
    done = plane.kubectl("create", "-o", "jsonpath={.metadata.namespace} {.metadata.name} {.metadata.uid}",
                         "-f", "-", input_text=text)
    namespace, name, uid = done.stdout.split()
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid}}


def allocate(plane: ControlPlane, claim: dict[str, Any], node: str, device: str) -> None:
    """Set the claim's status as the scheduler does: allocated on `node`'s pool, reserved for a pod."""
    meta = claim["metadata"]
    status = {"status": {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]}},
        "reservedFor": [{"resource": "pods", "name": f"pod-{meta['name']}", "uid": str(uuid.uuid4())}],
    }}
    plane.kubectl("patch", "resourceclaim", "-n", meta["namespace"], meta["name"], "--subresource=status",
                  "--type=merge", "-p", json.dumps(status))


@pytest.mark.slow
def test_one_deep_claim_is_skipped_and_named_and_the_rest_listed(kube_api: ControlPlane) -> None:
    good_ns, bad_ns = unique("team-a"), unique("team-b")
    for namespace in (good_ns, bad_ns):
        kube_api.kubectl("create", "namespace", namespace)
    good = create(kube_api, claim_json(good_ns, "ok"))
    deep = create(kube_api, claim_json(bad_ns, "deep", deep_json(DEEP)))
    client = connect(kube_api.admin_kubeconfig)

    listed = list_claims(client)
    assert isinstance(listed, ClaimListing)
    uids = {c["metadata"]["uid"] for c in listed}
    assert good["metadata"]["uid"] in uids and deep["metadata"]["uid"] not in uids
    [unreadable] = [u for u in listed.unreadable if u.namespace == bad_ns]
    assert unreadable.uid == deep["metadata"]["uid"]
    assert f"ResourceClaim {bad_ns}/deep" in unreadable.problem
    assert f"spec.devices.config[0].opaque.parameters is nested more than {MAX_DEPTH} levels" in \
        unreadable.problem

    with pytest.raises(UnreadableClaim, match=r"spec\.devices\.config\[0\]\.opaque\.parameters is nested"):
        get_claim(client, bad_ns, "deep")
    found = get_claim(client, good_ns, "ok")
    assert found is not None and found["kind"] == "ResourceClaim"
    assert get_claim(client, good_ns, "absent") is None


@pytest.mark.slow
def test_a_start_with_a_garbage_checkpoint_keeps_running_claims_beside_a_deep_one(
        kube_api: ControlPlane, tmp_path: Path) -> None:
    node, work, elsewhere = unique("node"), unique("work"), unique("hostile")
    for namespace in (work, elsewhere):
        kube_api.kubectl("create", "namespace", namespace)
    running = [create(kube_api, claim_json(work, f"run-{i}")) for i in (0, 1)]
    for claim, device in zip(running, ("gpu-0", "gpu-1"), strict=True):
        allocate(kube_api, claim, node, device)
    deep = create(kube_api, claim_json(elsewhere, "deep", deep_json(DEEP)))
    gone = str(uuid.uuid4())  # a spec whose claim the API server does not have
    running_uids = [c["metadata"]["uid"] for c in running]
    specs = Specs()
    for uid in (*running_uids, deep["metadata"]["uid"], gone):
        specs.files[uid] = ["gpu-0"]
    (tmp_path / "checkpoint.json").write_bytes(b"\x00garbage")
    client = connect(kube_api.admin_kubeconfig)
    preparer = ClaimPreparer(driver=DRIVER, pool=node, checkpoint_path=str(tmp_path / "checkpoint.json"),
                             lock_path=str(tmp_path / "pu.lock"), specs=specs,
                             get_claim=lambda ns, name: get_claim(client, ns, name),
                             view=lambda: NodeView(DEVICES), log=LOG)

    assert preparer.restore(lambda: list_claims(client)) is not None
    assert sorted(preparer.prepared()) == sorted(running_uids), "both running claims rebuilt"
    assert specs.files[running_uids[0]] == ["gpu-0"] and specs.files[running_uids[1]] == ["gpu-1"]
    assert deep["metadata"]["uid"] in specs.files, "the deep claim's spec: not proven orphaned"
    assert gone not in specs.files, "no claim has its UID (the deep one's UID is known)"
