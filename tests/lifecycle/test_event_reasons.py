"""Every Event reason nvdp records is declared in nvdp.daemon.report.event_reasons, with the daemons that own
it, and
the recorders refuse one that is not."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

from nvdp.daemon.report.event_reasons import DAEMONS, DRA_PLUGIN, FEATURE_DISCOVERY, REASONS, undeclared
from nvdp.daemon.report.recording import Recorder

SRC = Path(__file__).resolve().parents[2] / "src" / "nvdp"
# A reason is one CamelCase word; Event types are not reasons.
REASON = re.compile(r"[A-Z][A-Za-z]+")
EVENT_TYPES = {"Warning", "Normal"}
# The calls that take a reason: Recorder.event, the node reports, ClaimEvents.warning, the API edge.
REASON_CALLS = {"event", "report", "_report", "warning", "record", "record_claim_event"}
# Where a package's reasons must name its daemon as an owner.
PACKAGE_OWNERS = {"dra": DRA_PLUGIN, "gfd": FEATURE_DISCOVERY}


def _words(node: ast.AST, constants: dict[str, str]) -> set[str]:
    """The reason-like strings in an expression: literals, and module constants named in it."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
        elif isinstance(sub, ast.Name) and sub.id in constants:
            found.add(constants[sub.id])
    return {w for w in found if REASON.fullmatch(w) and w not in EVENT_TYPES}


def _constants() -> dict[str, str]:
    """Every module-level NAME = "CamelCase" in src/ (reasons are often named once and imported)."""
    found: dict[str, str] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant) \
                    and isinstance(value.value, str):
                found[target.id] = value.value
    return found


def used_reasons() -> dict[str, set[str]]:
    """Each reason used in src/, with the files that use it."""
    constants = _constants()
    used: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        where = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text())):
            words: set[str] = set()
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in REASON_CALLS:  # (an API Status's reason= is not an Event's)
                    for arg in node.args:
                        words |= _words(arg, constants) if not isinstance(arg, ast.JoinedStr) else set()
                    words |= {w for k in node.keywords if k.arg == "reason"
                              for w in _words(k.value, constants)}
            elif isinstance(node, ast.Assign):
                targets = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in node.targets]
                if "reason" in targets or any(t.endswith("_EVENTS") for t in targets):
                    words = _words(node.value, constants)
            elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "reason":
                words = _words(node.value, constants) if node.value is not None else set()
            for word in words:
                used.setdefault(word, set()).add(where)
    return used


def test_every_reason_used_in_src_is_declared_and_every_declared_one_is_used() -> None:
    used = used_reasons()
    assert {w: sorted(f) for w, f in used.items() if w not in REASONS} == {}, \
        "declare these reasons in nvdp.daemon.report.event_reasons.REASONS"
    assert sorted(set(REASONS) - set(used)) == [], "reasons declared but recorded nowhere: remove them"
    # Some reasons the scan must find, or it finds nothing at all.
    assert {"GPUUnhealthy", "ConfigPending", "UnknownConfig", "ClaimConfigDriverMismatch"} <= set(used)


def test_a_package_records_only_the_reasons_its_daemon_owns() -> None:
    for reason, files in used_reasons().items():
        for file in files:
            owner = PACKAGE_OWNERS.get(file.split("/", 1)[0])
            if owner is not None and "/" in file:
                assert owner in REASONS[reason].owners, f"{reason} is recorded in {file}, not by {owner}"
    for reason, declared in REASONS.items():
        assert declared.owners and declared.owners <= DAEMONS, reason


class Writer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def record(self, event_type: str, reason: str, message: str) -> None:
        self.sent.append((event_type, reason, message))

    def node_seen(self, uid: str) -> None: ...

    def close(self, timeout: float = 2.0) -> None: ...


def test_the_recorder_refuses_an_undeclared_reason(caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer()
    recorder = Recorder(writer)
    with caplog.at_level(logging.ERROR, logger="nvdp.daemon.report.recording"):
        recorder.event("GPUMelted", "not a reason nvdp declares")
        recorder.event("ClaimConfigDriverMismatch", "a claim's reason, not a Node's")
        recorder.event("GPUUnhealthy", "GPU-0: XID 79")
    assert writer.sent == [("Warning", "GPUUnhealthy", "GPU-0: XID 79")]
    assert [r.getMessage() for r in caplog.records] == [
        "Event reason 'GPUMelted' is not declared in nvdp.daemon.report.event_reasons.REASONS; not recorded: "
        "not a reason nvdp declares",
        "Event reason 'ClaimConfigDriverMismatch' is declared for a ResourceClaim, not a Node "
        "(nvdp.daemon.report.event_reasons); not recorded: a claim's reason, not a Node's"]
    assert undeclared("ClaimConfigDriverMismatch", "ResourceClaim") is None
