"""The DRA checkpoint file: round trip, atomic concurrent saves, and untrusted files set aside, never lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nvdp.dra.claims import checkpoint
from nvdp.dra.claims.checkpoint import (
    CHECKPOINT_VERSION,
    Loaded,
    encode_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from nvdp.dra.claims.records import ClaimEntry, PreparedDevice

GPU0 = PreparedDevice(request_names=("gpu",), pool="node-a", device="gpu-0",
                      cdi_ids=("k8s.gpu.nvidia.com/claim=uid-1-gpu-0",))
MIG = PreparedDevice(request_names=("a", "b"), pool="node-a", device="gpu-1-mig-1g10gb-19-0",
                     cdi_ids=("k8s.gpu.nvidia.com/claim=uid-2-gpu-1-mig-1g10gb-19-0",))
CLAIMS = {
    "uid-1": ClaimEntry(uid="uid-1", namespace="ns", name="one", state="PrepareCompleted", devices=(GPU0,)),
    "uid-2": ClaimEntry(uid="uid-2", namespace="ns", name="two", state="PrepareStarted", devices=(MIG,)),
    "uid-3": ClaimEntry(uid="uid-3", namespace="other", name="three", state="PrepareCompleted"),
}


def bad_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.bad-*"))


def assert_set_aside(path: Path, loaded: Loaded, content: bytes, *words: str) -> None:
    """The file was renamed aside with its content intact, and the problem says so and why."""
    assert loaded.claims == {}
    assert not path.exists()
    [aside] = bad_files(path)
    assert loaded.set_aside == str(aside)
    assert aside.read_bytes() == content
    assert loaded.problem is not None
    for word in (str(path), str(aside), "rebuilt from the API server", *words):
        assert word in loaded.problem


def test_a_missing_file_is_no_claims(tmp_path: Path) -> None:
    loaded = load_checkpoint(str(tmp_path / "checkpoint.json"))
    assert loaded == Loaded(claims={})


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "plugin" / "checkpoint.json"  # the folder is made on the first save
    save_checkpoint(str(path), CLAIMS)
    loaded = load_checkpoint(str(path))
    assert loaded == Loaded(claims=CLAIMS)
    save_checkpoint(str(path), {})
    assert load_checkpoint(str(path)) == Loaded(claims={})
    # Only the checkpoint and its lock file are left: no temporary files.
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json", "checkpoint.json.lock"]


def test_the_file_layout(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(str(path), CLAIMS)
    document = json.loads(path.read_text())
    assert sorted(document) == ["checksum", "claims", "version"]
    assert document["version"] == CHECKPOINT_VERSION == 1
    assert len(document["checksum"]) == 64
    assert document["claims"]["uid-1"] == {
        "uid": "uid-1", "namespace": "ns", "name": "one", "state": "PrepareCompleted",
        "devices": [{"request_names": ["gpu"], "pool": "node-a", "device": "gpu-0",
                     "cdi_ids": ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]}],
        "share": {},  # what its sharing needs on the node: nothing
        "steps": [],  # migStrategy dynamic: its MIG steps, each intent before its effect
        "status_pending": False,  # its status.devices entries are written
        "pod_claim_name": "",  # a claim named in the pod itself: its metadata under resourceclaims/
        "metadata_generation": 0,  # its device metadata files: written how often
        "instances": [],  # read from files before steps; never written
    }
    assert path.read_bytes() == encode_checkpoint(CLAIMS)


def test_the_checksum_does_not_depend_on_key_order_or_spacing(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    document = json.loads(encode_checkpoint(CLAIMS))
    # Written by another JSON encoder: reordered keys, indented.
    reordered = {"claims": dict(reversed(document["claims"].items())), "checksum": document["checksum"],
                 "version": document["version"]}
    path.write_text(json.dumps(reordered, indent=2))
    assert load_checkpoint(str(path)) == Loaded(claims=CLAIMS)


@pytest.mark.parametrize("content", [b"{not json", b"", b'{"version": 1, "checksum": "', b"[1, 2]"],
                         ids=["garbage", "empty", "cut-short", "not-an-object"])
def test_a_corrupt_file_is_set_aside(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content)


def test_a_bad_checksum_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(str(path), CLAIMS)
    # Hand-edited: another device for claim uid-1, the checksum left as it was.
    content = path.read_bytes().replace(b'"device":"gpu-0"', b'"device":"gpu-7"')
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content, "checksum")


def test_a_future_version_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    document = {"version": 2, "checksum": "whatever v2 uses", "claims": {"x": {"new": True}}}
    content = json.dumps(document).encode()
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content, "version 2", "newer", "reads version 1")


def test_an_old_version_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    content = json.dumps({"version": 0, "claims": {}}).encode()
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content, "version 0", "older")


def test_a_missing_version_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    content = b'{"claims": {}}'
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content, "no valid version (found None)")


def test_claims_of_the_wrong_shape_are_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    claims = {"uid-1": {"uid": "uid-1", "namespace": "ns", "name": "one"}}  # no state
    # A valid checksum, so only the shape is wrong.
    document = {"version": 1, "checksum": checkpoint._checksum(1, claims), "claims": claims}
    content = json.dumps(document).encode()
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content, "state")


def test_a_claim_under_another_uid_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    claims = {"uid-9": {"uid": "uid-1", "namespace": "ns", "name": "one", "state": "PrepareCompleted"}}
    document = {"version": 1, "checksum": checkpoint._checksum(1, claims), "claims": claims}
    content = json.dumps(document).encode()
    path.write_bytes(content)
    assert_set_aside(path, load_checkpoint(str(path)), content, "'uid-1' under the key 'uid-9'")


def test_earlier_bad_files_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    for content in (b"first", b"second", b"third"):  # in one second: the names must not collide
        path.write_bytes(content)
        assert load_checkpoint(str(path)).set_aside is not None
    assert sorted(p.read_bytes() for p in bad_files(path)) == [b"first", b"second", b"third"]


def test_only_the_newest_bad_files_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    # Left by earlier starts: older seconds, one of them with a numbered twin.
    for name in ("bad-100", "bad-100-1", "bad-200", "bad-300", "bad-400"):
        (tmp_path / f"checkpoint.json.{name}").write_bytes(name.encode())
    (tmp_path / "checkpoint.json.bad-notes").write_bytes(b"not ours: another name")
    for n in range(3):
        path.write_bytes(b"garbage %d" % n)
        assert load_checkpoint(str(path)).set_aside is not None
    kept = bad_files(path)
    assert len([p for p in kept if p.name != "checkpoint.json.bad-notes"]) == checkpoint.KEEP_SET_ASIDE == 5
    assert sorted(p.read_bytes() for p in kept) == sorted(
        [b"bad-300", b"bad-400", b"garbage 0", b"garbage 1", b"garbage 2", b"not ours: another name"])
    assert [os.path.basename(p) for p in checkpoint.set_aside_files(str(path))][:2] == [
        "checkpoint.json.bad-300", "checkpoint.json.bad-400"], "oldest first, by the time in the name"


def test_a_good_save_after_a_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b"{not json")
    assert load_checkpoint(str(path)).problem is not None
    save_checkpoint(str(path), CLAIMS)
    assert load_checkpoint(str(path)) == Loaded(claims=CLAIMS)
    assert len(bad_files(path)) == 1


def test_concurrent_saves_from_threads_leave_one_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    versions = [
        {f"uid-{t}-{i}": ClaimEntry(uid=f"uid-{t}-{i}", namespace="ns", name=f"c{i}",
                                    state="PrepareCompleted", devices=(GPU0,) * i) for i in range(20)}
        for t in range(8)
    ]
    errors: list[BaseException] = []

    def writer(claims: dict[str, ClaimEntry]) -> None:
        try:
            for _ in range(10):
                save_checkpoint(str(path), claims)
                loaded = load_checkpoint(str(path))
                assert loaded.problem is None, loaded.problem
                assert loaded.claims in versions
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert load_checkpoint(str(path)).claims in versions
    assert bad_files(path) == []
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "checkpoint.json.lock"]


# Each process saves its own claim 20 times; nvdp comes from the same interpreter's path.
_SAVER = """
import sys
from nvdp.dra.claims.checkpoint import save_checkpoint
from nvdp.dra.claims.records import ClaimEntry
from nvdp.dra.claims.records import PreparedDevice
path, tag = sys.argv[1], sys.argv[2]
device = PreparedDevice(request_names=("gpu",), pool="node-a", device="gpu-0", cdi_ids=("a/b=c",))
entry = ClaimEntry(uid=tag, namespace="ns", name="c", state="PrepareCompleted", devices=(device,) * 50)
claims = {tag: entry}
for _ in range(20):
    save_checkpoint(path, claims)
"""


@pytest.mark.slow
def test_concurrent_saves_from_processes_leave_one_whole_file(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint.json")
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, path, f"u{tag}"]) for tag in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    loaded = load_checkpoint(path)
    assert loaded.problem is None
    [uid] = loaded.claims
    assert uid in {"u0", "u1", "u2", "u3"}
    assert len(loaded.claims[uid].devices) == 50
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "checkpoint.json.lock"]
