"""Each fact the daemons share has one home in the source: a second copy of it fails here.

A fact written twice drifts: the CDI strategies were listed in two modules (kept in step by a test of
their equality) and tested in five ways. Each row names the fact, a pattern that finds a definition
of it, and the one module allowed to hold it; everyone else imports it from there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "nvdp"

# fact -> (pattern of a definition, the module that is its home, relative to src/nvdp)
HOMES: dict[str, tuple[str, str]] = {
    "the device list strategies that hand out CDI names": (
        r"""["']cdi-(?:annotations|cri)["']\s*,\s*["']cdi-(?:annotations|cri)["']""",
        "config/model.py",
    ),
    "whether CDI is on: a config's CDI strategies": (
        r"def cdi_strategies\b|\.isdisjoint\([^)]*device_list_strategy",
        "config/model.py",
    ),
    "the device plugin's CDI vendor": (r"""["']k8s\.device-plugin\.nvidia\.com["']""", "cdi/names.py"),
    "how CDI qualifies a device name": (r"def (?:qualified|kind_of)\b", "cdi/names.py"),
    "where a claim's allocation results are read": (r"""get\(["']results["']\)""", "claim_results.py"),
    "the DRA driver's default name": (r"""["']gpu\.nvidia\.com["']""", "config/names.py"),
    "the variable that names the DRA driver": (r"""["']DRA_DRIVER_NAME["']""", "config/names.py"),
    "the variable that sets a node's default mode": (r"""["']NVDP_DEFAULT_MODE["']""", "config/names.py"),
    "the variable that names this node": (r"""["']NODE_NAME["']""", "config/names.py"),
    "the variable that names the config file": (r"""["']CONFIG_FILE["']""", "config/sources.py"),
    "how a chosen per-node entry replaces the config file": (r"!=\s*CONFIG_FILE_ENV\b", "config/loader.py"),
}


def _sources() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "api" not in p.relative_to(SRC).parts[:-1]]


@pytest.mark.parametrize("fact", sorted(HOMES))
def test_a_fact_has_one_home(fact: str) -> None:
    pattern, home = HOMES[fact]
    found = {
        str(path.relative_to(SRC))
        for path in _sources()
        if re.search(pattern, path.read_text(encoding="utf-8"))
    }
    assert found == {home}, (
        f"{fact}: defined in {sorted(found)}; its one home is src/nvdp/{home}: import it from there"
    )
