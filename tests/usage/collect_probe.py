"""A process that collects the node's usage as the plugins do, one collection per line it reads, for
tests that need the stand-in NVML (loaded by this process, not the test's).

    python -m tests.usage.collect_probe SETTINGS_JSON

SETTINGS_JSON: {"node", "socket", "proc_root", "checkpoint" (null: not the device plugin), "driver" and
"claims" (a JSON file {"<namespace>/<name>": claim}; null: not the DRA plugin), "refresh_s"}. Prints
READY, then for each line one JSON line: the usage, the series' exposition and how many claims were read.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, generate_latest

from nvdp.dra.pool.names import device_uuids
from nvdp.usage import collect as collect_module
from nvdp.usage.collect import DraCounting, UsageCollector, UsageSource
from nvdp.usage.series import families


class _Families:
    def __init__(self, found: list[Any]) -> None:
        self.found = found

    def collect(self) -> list[Any]:
        return self.found


def main(settings: dict[str, Any]) -> None:
    collect_module.REFRESH_S = float(settings.get("refresh_s", collect_module.REFRESH_S))
    reads: list[str] = []

    def read_claim(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(f"{namespace}/{name}")
        with open(settings["claims"]) as f:
            claims: dict[str, Any] = json.load(f)
        return claims.get(f"{namespace}/{name}")

    dra = DraCounting(settings["driver"], device_uuids, read_claim) if settings.get("driver") else None
    checkpoint = settings.get("checkpoint")
    collector = UsageCollector(UsageSource(settings["node"], settings["socket"], settings["proc_root"]),
                               checkpoint=(lambda: checkpoint) if checkpoint else None, dra=dra,
                               log=logging.getLogger("probe"))
    print("READY", flush=True)
    for _ in sys.stdin:
        usage = collector.collect()
        registry = CollectorRegistry()
        registry.register(_Families(families(usage)))  # type: ignore[arg-type]
        print(json.dumps({"usage": msgspec.to_builtins(usage), "metrics": generate_latest(registry).decode(),
                          "claim_reads": list(reads)}), flush=True)
        reads.clear()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
