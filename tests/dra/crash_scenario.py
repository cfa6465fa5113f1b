"""Run in a process whose NVML is the stand-in (tests/dra/test_crash_points.py): one step of the DRA
plugin's claim transaction under migStrategy dynamic on one H100, with everything it keeps on disk
(checkpoint, claim specs, status writes) in WORK_DIR, so a process killed at any point leaves what a
killed plugin leaves. Prints what it observed, as JSON.

    python -m tests.dra.crash_scenario STATE_DIR WORK_DIR ACTION

ACTION: `setup` (an admin's MIG device at slice 6 and claim B prepared at slice 5), `prepare` or
`unprepare` (claim A: 3g.40gb at slice 0 and 1g.10gb at slice 4), `remake-foreign` (an admin deletes
A's 1g.10gb and makes their own at the same place). Each first reports what the pool takes for foreign
before the start replays anything. With CRASH_AFTER_SAVES=K in the environment the process
kills itself (SIGKILL) right after the K-th checkpoint save of the action; the stand-in's
NVML_SIM_KILL_AFTER=N does the same after its N-th changing NVML call.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pynvml

from nvdp.cdi.spec import ContainerEdits
from nvdp.config.loader import load_config
from nvdp.dra.claims import book
from nvdp.dra.claims.check import NodeView
from nvdp.dra.claims.checkpoint import load_checkpoint, read_owned_mig
from nvdp.dra.claims.identity.metadata import ClaimFile
from nvdp.dra.claims.mig import ClaimInstances
from nvdp.dra.claims.preparer import ClaimPreparer
from nvdp.dra.claims.records import ClaimRef
from nvdp.dra.pool.contents import foreign_instances, pool_devices
from nvdp.dra.pool.devices import DraDevice, by_name
from nvdp.inventory.mig_control import MigControl
from nvdp.inventory.model import MigDevice
from nvdp.inventory.nvml import discover
from tests.dra.test_prepare import Cluster, claim

LOG = logging.getLogger("crash-scenario")
A_DEVICES = ("gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-4")
B_DEVICE = "gpu-0-mig-1g10gb-19-5"
ADMIN = (19, 6)  # an admin's 1g.10gb (GI profile 19) at memory slice 6


class FileSpecs:
    """The per-claim CDI specs as files in WORK_DIR/specs (what survives a kill, as the real ones)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None, files: Sequence[ClaimFile] = ()) -> dict[str, str]:
        body = {d.name: (made or {})[d.name].uuid if d.name in (made or {}) else d.uuid for d in devices}
        tmp = self.root / f".{claim_uid}.tmp"
        tmp.write_text(json.dumps(body))
        tmp.replace(self.root / f"{claim_uid}.json")
        return {d.name: f"k8s.gpu.nvidia.com/claim={claim_uid}-{d.name}" for d in devices}

    def remove(self, claim_uid: str) -> None:
        (self.root / f"{claim_uid}.json").unlink(missing_ok=True)

    def exists(self, claim_uid: str) -> bool:
        return (self.root / f"{claim_uid}.json").exists()

    def present(self) -> frozenset[str]:
        return frozenset(p.stem for p in self.root.glob("*.json"))

    def read(self) -> dict[str, Any]:
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.root.glob("*.json"))}


def kill_after_saves(limit: int) -> None:
    """Kill this process (no clean-up of any kind) right after the `limit`-th checkpoint save."""
    saves = 0
    real = getattr(book, "save_checkpoint")  # noqa: B009 (the module's own name for it)

    def save(path: str, claims: Any) -> None:
        nonlocal saves
        real(path, claims)
        saves += 1
        if saves >= limit:
            os.kill(os.getpid(), signal.SIGKILL)

    setattr(book, "save_checkpoint", save)  # noqa: B010


def main(state_dir: str, work: str, action: str) -> dict[str, Any]:
    config = load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra"})
    gpu = discover().gpus[0].uuid
    control = MigControl()
    root = Path(work)
    checkpoint = str(root / "checkpoint.json")
    specs = FileSpecs(root / "specs")
    view = by_name(pool_devices(config, discover(), read_owned_mig(checkpoint).owns))
    cluster = Cluster(claim("a", "u-a", *A_DEVICES), claim("b", "u-b", B_DEVICE))
    statuses = root / "status.jsonl"

    def status(namespace: str, name: str, entries: list[dict[str, Any]]) -> None:
        with statuses.open("a") as f:
            f.write(json.dumps({"claim": name, "devices": entries}) + "\n")

    p = ClaimPreparer(driver="gpu.nvidia.com", pool="node-a", checkpoint_path=checkpoint,
                      lock_path=str(root / "pu.lock"), specs=specs, get_claim=cluster.get,
                      view=lambda: NodeView(view), log=LOG, in_use=lambda: (),
                      instances=ClaimInstances(control, LOG), status=status)
    # What the pool takes for foreign as the plugin starts, before the start replays the record.
    foreign = foreign_instances(discover(), read_owned_mig(checkpoint).owns)
    out: dict[str, Any] = {"foreign_before_start": sorted(m.uuid for migs in foreign.values() for m in migs)}
    if os.environ.get("CRASH_AFTER_SAVES"):
        kill_after_saves(int(os.environ["CRASH_AFTER_SAVES"]))
    p.restore(None)
    if action == "setup":
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.encode())
        gi_id = control.create_gpu_instance(gpu, ADMIN[0], ADMIN[1], 1, "1g.10gb")
        out["admin"] = control.create_compute_instance(gpu, gi_id, ADMIN[0], "1g.10gb").uuid
        pynvml.nvmlShutdown()
        del handle
        out["answer"] = p.prepare([ClaimRef("default", "u-b", "b")])["u-b"].error
    elif action == "prepare":
        out["answer"] = p.prepare([ClaimRef("default", "u-a", "a")])["u-a"].error
    elif action == "unprepare":
        out["answer"] = p.unprepare([ClaimRef("default", "u-a", "a")])["u-a"]
    elif action == "remake-foreign":
        a = {s.device: s for s in p.prepared()["u-a"].made}["gpu-0-mig-1g10gb-19-4"]
        assert a.mig is not None and a.gi_id is not None
        control.destroy_gpu_instance(gpu, a.gi_id)
        gi_id = control.create_gpu_instance(gpu, 19, 4, 1, "1g.10gb")
        out["admin_remade"] = control.create_compute_instance(gpu, gi_id, 19, "1g.10gb").uuid
        out["same_gi_id"] = gi_id == a.gi_id
    out["live"] = {m.uuid: f"{m.profile}@{m.placement_start}" for m in control.live(gpu)}
    out["bare"] = [f"{g.gi_profile_id}@{g.start}" for g in control.gpu_instances(gpu) if not g.mig_uuids]
    entries = load_checkpoint(checkpoint).claims
    out["checkpoint"] = {uid: {"state": e.state, "made": sorted(s.mig.uuid for s in e.made if s.mig),
                               "steps": len(e.steps)} for uid, e in entries.items()}
    out["specs"] = specs.read()
    lines = statuses.read_text().splitlines() if statuses.exists() else []
    out["statuses"] = [json.loads(line) for line in lines]
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3])))
