"""Run in a process whose NVML is the stand-in (tests/dra/test_dynamic_prepare.py): the DRA plugin's
preparer with migStrategy dynamic on one H100, through nvdp.inventory.mig_control and the stand-in's
MIG rules. Prints what it observed, as JSON, for the test to check.

    python -m tests.dra.dynamic_scenario STATE_DIR WORK_DIR
"""

from __future__ import annotations

import ctypes
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pynvml

from nvdp.config.loader import load_config
from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.checkpoint import load_checkpoint, read_owned_mig
from nvdp.dra.claims.mig import ClaimInstances
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import ClaimRef
from nvdp.dra.pool.contents import pool_devices
from nvdp.dra.pool.devices import by_name
from nvdp.inventory.mig_control import MigControl
from nvdp.inventory.nvml import discover
from sim.nvml import reboot
from tests.dra.test_prepare import Cluster, Specs, claim

LOG = logging.getLogger("dynamic-scenario")
GPU = "gpu-0"


def main(state_dir: str, work: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    config = load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra"})
    inventory = discover()
    gpu = inventory.gpus[0]
    control = MigControl()
    checkpoint = str(Path(work) / "checkpoint.json")
    statuses: list[Any] = []

    def devices() -> dict[str, Any]:
        return by_name(pool_devices(config, discover(), read_owned_mig(checkpoint).owns))

    view = devices()
    out["published"] = len(view)
    cluster = Cluster(
        claim("big", "u-big", "gpu-0-mig-3g40gb-9-0"),
        claim("mid", "u-mid", "gpu-0-mig-2g20gb-14-4"),
        claim("small", "u-small", "gpu-0-mig-1g10gb-19-6"),
        claim("overlap", "u-overlap", "gpu-0-mig-3g40gb-9-4"),
        claim("whole", "u-whole", GPU),
        claim("again", "u-again", "gpu-0-mig-1g10gb-19-6"),
    )
    specs = Specs()

    def preparer() -> ClaimPreparer:
        return ClaimPreparer(driver="gpu.nvidia.com", pool="node-a", checkpoint_path=checkpoint,
                             lock_path=str(Path(work) / "pu.lock"), specs=specs, get_claim=cluster.get,
                             view=lambda: NodeView(view), log=LOG,
                             instances=ClaimInstances(control, LOG),
                             status=lambda ns, n, e: statuses.append(e))

    def ref(name: str) -> ClaimRef:
        return ClaimRef(namespace="default", uid=f"u-{name}", name=name)

    def live() -> list[str]:
        return sorted(f"{m.profile}@{m.placement_start}" for m in control.live(gpu.uuid))

    p = preparer()
    p.restore(None)
    started = time.perf_counter()
    answers = p.prepare([ref("big"), ref("mid"), ref("small")])
    out["prepare_three_s"] = time.perf_counter() - started
    out["errors"] = {uid: a.error for uid, a in answers.items()}
    out["live_after_three"] = live()
    out["made"] = {uid: dict(m) for uid, m in specs.made.items()}
    out["statuses"] = list(statuses)
    out["checkpoint_instances"] = {uid: [m.mig.uuid for m in e.made if m.mig]
                                   for uid, e in load_checkpoint(checkpoint).claims.items()}
    # The scheduler never allocates this (the counters overlap); NVML refuses it all the same.
    out["overlap"] = p.prepare([ref("overlap")])["u-overlap"]
    out["live_after_overlap"] = live()
    out["whole_while_mig"] = p.prepare([ref("whole")])["u-whole"].error
    # A restart keeps what it made; the preview leaves nothing of it out.
    p = preparer()
    p.restore(None)
    view = devices()
    out["after_restart"] = {"prepared": sorted(p.prepared()), "live": live(),
                            "published": len(view)}
    # A reboot: the MIG devices are gone; the kubelet's prepare makes them again.
    reboot(Path(state_dir))
    out["live_after_reboot"] = live()
    old = p.prepared()["u-small"].made[0].mig.uuid  # type: ignore[union-attr]
    again = p.prepare([ref("small")])["u-small"]
    new = p.prepared()["u-small"].made[0].mig.uuid  # type: ignore[union-attr]
    out["remade"] = {"error": again.error, "changed": old != new, "live": live(),
                     "spec_uuid": specs.made["u-small"]}
    # Unprepare destroys; someone else's MIG device then holds a placement nvdp publishes.
    out["unprepare"] = p.unprepare([ref("big"), ref("mid"), ref("small")])
    out["live_after_unprepare"] = live()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid.encode())
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 6, 1
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    out["foreign"] = p.prepare([ref("again")])["u-again"]
    out["live_with_foreign"] = live()
    view = devices()
    out["published_with_foreign"] = sorted(n for n in view if n.endswith("-6") or n == GPU or "7g" in n)
    pynvml.nvmlComputeInstanceDestroy(pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    pynvml.nvmlGpuInstanceDestroy(gi)
    pynvml.nvmlShutdown()
    # The whole GPU: MIG mode goes off for it, and on again for the next MIG device.
    view = devices()
    whole = p.prepare([ref("whole")])["u-whole"]
    out["whole"] = {"error": whole.error, "mig_mode": pynvml_mig_mode(gpu.uuid)}
    p.unprepare([ref("whole")])
    small = p.prepare([ref("again")])["u-again"]
    out["mig_again"] = {"error": small.error, "mig_mode": pynvml_mig_mode(gpu.uuid), "live": live()}
    p.unprepare([ref("again")])
    out["live_at_end"] = live()
    return out


def pynvml_mig_mode(uuid: str) -> int:
    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode()))[0])
    finally:
        pynvml.nvmlShutdown()


def _plain(value: Any) -> Any:
    if hasattr(value, "__struct_fields__"):
        return {f: _plain(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


if __name__ == "__main__":
    print(json.dumps(_plain(main(sys.argv[1], sys.argv[2]))))
