"""A doctor's findings as plain data, printed as text (PASS / FAIL / SKIP and the fix) or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from msgspec import Struct
from msgspec.structs import asdict

Status = Literal["PASS", "FAIL", "SKIP"]


class Finding(Struct, frozen=True):
    check: str  # stable id, e.g. "nvml"
    title: str  # what was checked, e.g. "NVML loads"
    status: Status
    detail: str  # what was found
    fix: str = ""  # what to do, for FAIL (and SKIP when something else must be fixed first)


def passed(check: str, title: str, detail: str) -> Finding:
    return Finding(check, title, "PASS", detail)


def failed(check: str, title: str, detail: str, fix: str) -> Finding:
    return Finding(check, title, "FAIL", detail, fix)


def skipped(check: str, title: str, detail: str) -> Finding:
    return Finding(check, title, "SKIP", detail)


def healthy(findings: Sequence[Finding]) -> bool:
    return all(f.status != "FAIL" for f in findings)


def as_text(findings: Sequence[Finding]) -> str:
    lines = []
    for number, finding in enumerate(findings, 1):
        lines.append(f"{number}. [{finding.status}] {finding.title}: {finding.detail}")
        if finding.fix:
            lines.append(f"   fix: {finding.fix}")
    failures = sum(f.status == "FAIL" for f in findings)
    lines.append("all checks passed" if not failures else f"{failures} check(s) failed")
    return "\n".join(lines) + "\n"


def as_json(findings: Sequence[Finding]) -> str:
    return json.dumps({"ok": healthy(findings), "checks": [asdict(f) for f in findings]}, indent=2) + "\n"
