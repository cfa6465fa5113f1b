"""The doctor's MPS check: for each resource shared with MPS, the control daemon answers, and the
plugin's /dev/shm is the daemon's; when it does not, which of the usual causes it is (no
`nvidia.com/mps.capable` label, the daemon failing, an unshared /dev/shm) and the fix."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.doctor.where import Where
from nvdp.plan.model import Plan


class MpsChecks:
    where: Where
    plan: Plan | None

    def mps(self) -> list[Finding]:
        title = "the MPS control daemon answers"
        if self.plan is None:
            return [skipped("mps", title, "no plan (see above)")]
        shared = [r for r in self.plan.resources if r.sharing == "mps"]
        if not shared:
            return [passed("mps", title, "no resource is shared with MPS")]
        return [self._mps_resource(r.name) for r in shared]

    def _mps_resource(self, name: str) -> Finding:
        from nvdp.mps.paths import container_root, shm_dir
        from nvdp.mps.status import read_status
        from nvdp.plugin.mps_gate import MPS_CAPABLE_LABEL, MpsGate

        title = f"the MPS control daemon answers for {name}"
        gate = MpsGate.from_env(name, logging.getLogger("nvdp.doctor"), self.where.env)
        problem = gate.problem()
        shm_problem = self._shm_problem(shm_dir(container_root(self.where.env)))
        if problem is None and shm_problem is None:
            return passed("mps", title, f"it answers at {gate.paths.pipe_dir}")
        node = self.where.node_name or "<node>"
        causes, fixes = [], []
        status = read_status(gate.paths.status_file)
        daemon_reports = status is not None and status.is_current()  # its pod runs, but the daemon fails
        if problem is not None and not daemon_reports and not gate.paths.ready_marker.exists():
            key, _, value = MPS_CAPABLE_LABEL.partition("=")
            read = self.where.node_labels()
            labels = read.labels
            if labels is None:
                causes.append(
                    f"the daemon is not running on this node (no {gate.paths.ready_marker}); the node "
                    f"label {MPS_CAPABLE_LABEL} could not be read ({read.problem})"
                )
                fixes.append(
                    f"`kubectl get node {node} -L {key}`; if empty: `kubectl label node {node} "
                    f"{MPS_CAPABLE_LABEL}`; else see the MPS daemon pod's state and log"
                    + (f"; API: {read.fix}" if read.error else "")
                )
            elif labels.get(key) != value:
                causes.append(
                    f"node {node} lacks the label {MPS_CAPABLE_LABEL}, so the chart does not run the "
                    "MPS daemon here"
                )
                fixes.append(f"kubectl label node {node} {MPS_CAPABLE_LABEL}")
            else:
                causes.append(f"node {node} has {MPS_CAPABLE_LABEL} but the MPS daemon is not ready")
                fixes.append(
                    "see the MPS daemon pod on this node: `kubectl -n <namespace> get pods -o wide "
                    f"--field-selector spec.nodeName={node}` and its log"
                )
        elif problem is not None:
            causes.append(problem)
            fixes.append("see the MPS daemon pod's log on this node")
        if shm_problem is not None:
            causes.append(shm_problem)
            fixes.append(
                "restart the plugin pod after the MPS daemon's init container has mounted "
                "<mps.root>/shm (the chart mounts it at /dev/shm in both pods)"
            )
        return failed("mps", title, "; ".join(causes), "; ".join(fixes))

    def _shm_problem(self, shared: Path) -> str | None:
        if self.where.context != "container":
            return None
        try:
            mine, theirs = os.stat(self.where.shm), os.stat(shared)
        except OSError as err:
            return f"cannot compare /dev/shm with {shared}: {err.strerror}"
        if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
            return f"{self.where.shm} is not {shared}, so MPS clients and the daemon would not share memory"
        return None
