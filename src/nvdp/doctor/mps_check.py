"""The doctor's MPS check: for each resource shared with MPS, the control daemon answers, and the
plugin's /dev/shm is the daemon's; when it does not, which of the usual causes it is (no
`nvidia.com/mps.capable` label, the daemon failing, an unshared /dev/shm) and the fix.

It also shows the limits MPS enforces: in device-plugin mode each resource's ceiling (the replica
share, the same for every client, so all of it enforced); in DRA mode, for each MPS daemon the DRA
plugin runs, the ceiling its server holds every client to and each claim's own limits, with the part
of them only the claim's environment keeps (advisory) where claims on one GPU set ask for different
limits. Both come from what the daemons compute and write (`nvdp.mps.commands`, `limits.json`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nvdp.config.model import Config
from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.doctor.where import Where
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan, PlannedResource

DRA_TITLE = "the MPS limits of the DRA plugin's daemon for"


class MpsChecks:
    where: Where
    plan: Plan | None
    inventory: Inventory | None
    config: Config

    def mps(self) -> list[Finding]:
        title = "the MPS control daemon answers"
        claims = self._dra_mps_limits() + self._upgrades_waiting()
        if self._dra_mode():
            return claims or [passed("mps", title, "DRA mode: the DRA plugin runs MPS for its claims, and "
                                                   "none on this node uses MPS")]
        if self.plan is None:
            return [skipped("mps", title, "no plan (see above)"), *claims]
        shared = [r for r in self.plan.resources if r.sharing == "mps"]
        if not shared:
            return [passed("mps", title, "no resource is shared with MPS"), *claims]
        return [self._mps_resource(r) for r in shared] + claims

    def _upgrades_waiting(self) -> list[Finding]:
        """A new MPS daemon pod of this node that waits to take over (mps.upgrade whenIdle), in either
        mode: which pods or claims it waits for (nvdp.mps.node.handover)."""
        from nvdp.config.names import DRA_DRIVER_ENV, node_name
        from nvdp.dra.pool.names import DEFAULT_DRIVER
        from nvdp.mps.node.handover import live_wait
        from nvdp.mps.paths import container_root

        root = container_root(self.where.env)
        driver = self.where.env.get(DRA_DRIVER_ENV) or DEFAULT_DRIVER
        findings = []
        for base in (root, root / driver):
            waiting = live_wait(base)
            if waiting is None:
                continue
            findings.append(failed(
                "mps", "an upgrade of the MPS daemon waits", waiting.message(node_name(self.where.env)),
                "nothing: it takes over once those pods end. To upgrade now (their MPS clients fail), delete "
                "the old MPS daemon pod of this node; chart value mps.upgrade=immediately does so on every "
                "upgrade"))
        return findings

    def _dra_mode(self) -> bool:
        from nvdp.doctor.dra_check import dra_node, node_mode

        node = dra_node(self.where.env)
        return node.on and node_mode(self.config, self.where.env, node) == "dra"

    def _limits(self, resource: PlannedResource) -> str:
        """The resource's ceiling as its daemon computes it: the same for every client."""
        from nvdp.mps.commands import MpsConfigError, mps_settings

        if self.inventory is None:
            return ""
        try:
            settings = mps_settings(resource, self.inventory)
        except MpsConfigError as err:
            return f"; limits: {err}"
        memory = ", ".join(f"{mib} MiB on GPU {g.index}" if (mib := settings.memory_limit_mib(g)) is not None
                           else f"no memory limit on GPU {g.index}" for g in settings.gpus)
        return (f"; enforced for every client (each gets the same share): "
                f"{settings.active_thread_percentage}% threads, {memory}")

    def _dra_mps_limits(self) -> list[Finding]:
        """One finding per MPS daemon the DRA plugin runs: its ceiling and each claim's limits."""
        from nvdp.config.names import DRA_DRIVER_ENV
        from nvdp.dra.claims.sharing.mps_limits import LIMITS_FILE, describe_ceiling, enforcement, read_limits
        from nvdp.dra.pool.names import DEFAULT_DRIVER
        from nvdp.mps.paths import STATUS_FILE, container_root
        from nvdp.mps.status import read_status

        driver = self.where.env.get(DRA_DRIVER_ENV) or DEFAULT_DRIVER
        base = container_root(self.where.env) / driver
        try:
            files = sorted(base.glob(f"*/{LIMITS_FILE}"))
        except OSError:
            return []
        findings = []
        for path in files:
            found = read_limits(path)
            title = f"{DRA_TITLE} {path.parent.name}"
            if found is None:
                findings.append(failed("mps", title, f"{path} cannot be read as the daemon's limits",
                                       "restart the DRA plugin pod: it writes the file again"))
                continue
            parts = [f"enforced ceiling (every client of its MPS server): "
                     f"{describe_ceiling(found.gpus, found.ceiling)}"]
            for uid, limits in sorted(found.claims.items()):
                held = enforcement(limits, found.gpus, found.ceiling)
                how = ("enforced" if held.enforced
                       else f"advisory (its environment only): {'; '.join(held.advisory)}")
                parts.append(f"claim {uid}: {limits.describe()}, {how}")
            status = read_status(path.parent / STATUS_FILE)
            if status is not None and status.is_current() and status.state == "failing":
                problem = f"the daemon is failing: {status.error}; " + "; ".join(parts)
                findings.append(failed("mps", title, problem, "read the DRA plugin's log (`kubectl logs <dra "
                                       f"plugin pod>`) and {path.parent / 'log' / 'control.log'}"))
                continue
            findings.append(passed("mps", title, "; ".join(parts)))
        return findings

    def _mps_resource(self, resource: PlannedResource) -> Finding:
        name = resource.name
        from nvdp.mps.paths import container_root, shm_dir
        from nvdp.mps.status import read_status
        from nvdp.plugin.mps_gate import MPS_CAPABLE_LABEL, MpsGate

        title = f"the MPS control daemon answers for {name}"
        gate = MpsGate.from_env(name, logging.getLogger("nvdp.doctor"), self.where.env)
        problem = gate.problem()
        shm_problem = self._shm_problem(shm_dir(container_root(self.where.env)))
        if problem is None and shm_problem is None:
            return passed("mps", title, f"it answers at {gate.paths.pipe_dir}{self._limits(resource)}")
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
