"""The doctor's health check: the GPUs the plugin holds down on this node, read from its record."""

from __future__ import annotations

from nvdp.doctor.report import Finding, failed, passed
from nvdp.health.state import StateError, down_gpus, read_state

TITLE = "no GPU is held down by the health checks"
# What brings a GPU back, by the state its record gives it (nvdp.health.ledger).
FIXES = {
    "recovering": "nothing: it comes back by itself once no critical XID arrived for the quiet period "
                  "and NVML finds it fine",
    "needs-reset": "reset the GPU once no process uses it (nvidia-smi -r -i <uuid>) or reboot the node; "
                   "the plugin sees the reset through NVML and brings the GPU back",
    "flapping": "find why it keeps failing (the Events name the XIDs), then `nvdp health clear <uuid>` in "
                "the plugin's container",
    "recovery-off": "restart the plugin (healthRecoveryAfter is never), or set a quiet period",
}


def health_findings(directory: str) -> list[Finding]:
    """One finding from the record in `directory`; none when the plugin keeps no record."""
    if not directory:
        return []
    try:
        record = read_state(directory)
    except StateError as err:
        return [failed("health", TITLE, str(err), "delete the file; every GPU then starts healthy")]
    gpus = down_gpus(record)
    if not gpus:
        return [passed("health", TITLE, f"no GPU is down (record in {directory})")]
    lines = [f"{gpu} {entry.get('state')}: {entry.get('reason')}"
             + (f" (kept down: {entry['blocked']})" if entry.get("blocked") else "")
             for gpu, entry in sorted(gpus.items())]
    fixes = sorted({FIXES.get(str(entry.get("state")), "") for entry in gpus.values()} - {""})
    return [failed("health", TITLE, f"{len(gpus)} GPU(s) down: " + "; ".join(lines), "; ".join(fixes))]
