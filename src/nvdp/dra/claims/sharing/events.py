"""Warning Events on the ResourceClaims this plugin prepares (`kubectl describe resourceclaim` lists
them), for what the claim's author must fix and nothing else would tell them: a config addressed to a
mistyped driver name (nvdp.dra.claims.sharing.config_drivers), which DRA ignores without a word.

Each reason is recorded once per claim: the kubelet retries a prepare that fails for another cause,
and each retry must not add an Event.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nvdp.daemon.report.event_reasons import undeclared

if TYPE_CHECKING:
    from nvdp.kube import KubeClient

# A config whose driver is a near miss of this driver's name.
CONFIG_DRIVER_MISMATCH = "ClaimConfigDriverMismatch"
# Claims remembered as warned; older ones may be warned again (a restart forgets them all anyway).
REMEMBERED = 4096


class ClaimEvents:
    """Records Warning Events on claims through `client`, each (claim UID, reason) once; thread-safe
    under the preparer's lock, which every caller holds."""

    def __init__(self, client: KubeClient, *, node: str, component: str, log: logging.Logger) -> None:
        self._client = client
        self._node = node
        self._component = component
        self._log = log
        self._sent: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.recorded = 0

    def warning(self, claim: Mapping[str, Any], reason: str, message: str) -> None:
        """Log the warning, and record it on the claim unless it was already (or its reason is not
        declared for claims in nvdp.daemon.report.event_reasons: logged as an ERROR)."""
        from nvdp.kube import record_claim_event

        meta = claim.get("metadata") or {}
        namespace, name, uid = (str(meta.get(k, "")) for k in ("namespace", "name", "uid"))
        self._log.warning("Claim %s/%s: %s", namespace, name, message)
        problem = undeclared(reason, "ResourceClaim")
        if problem is not None:
            self._log.error("%s; not recorded on claim %s/%s", problem, namespace, name)
            return
        key = (uid, reason)
        if key in self._sent:
            return
        self._sent[key] = None
        if len(self._sent) > REMEMBERED:
            self._sent.popitem(last=False)
        if record_claim_event(self._client, namespace=namespace, name=name, uid=uid, event_type="Warning",
                              reason=reason, message=message, component=self._component, host=self._node):
            self.recorded += 1
