"""The per-node mode: which API serves a node's GPUs, the device plugin's or DRA's, and when it may change.

Every daemon reads the mode from the config it puts in force (`node_mode`: the entry's `flags.mode`,
else env `NVDP_DEFAULT_MODE`, which the chart sets from `dra.defaultMode`, else "device-plugin"), so a
node's mode follows its per-node config label like any other setting. One policy, `ModeGate`, is used
by every daemon from its `switch` (nvdp.daemon.pernode.nodechoice):

- a config whose mode differs from the one in force is a *mode switch*; it goes in only while no GPU
  pod runs on the node (`gpu_pods`: not Succeeded/Failed, asking for an `nvidia.com/*` extended
  resource or holding a ResourceClaim allocated from this node's pool of the DRA driver). Otherwise
  it raises `ModeSwitchRefused` (a `ConfigPending`: the rule keeps what runs, reports once and tries
  again, so the node switches by itself once the pods are gone). A daemon given the kubelet's answer
  (`KubeletPods`: its pod-resources API, which lists the pods it runs, the devices of device-plugin
  resources and the claims of each container) asks the kubelet (`kubelet_gpu_pods`), not the API
  server: no pod list, no claim read; the others list the pods bound to the node through the API;
- at start nothing of ours runs, so the mode in force is simply taken, without the pods check;
- without API access a running daemon cannot check for pods: a mode switch then waits for a restart.

Never both APIs at once: the device plugin in "dra" mode serves nothing, the DRA plugin in
"device-plugin" mode deletes its ResourceSlices. The one entering its mode waits for the other to let
go (`Handover`, polled from its loop): the DRA plugin until the Node's allocatable shows none of the
device plugin's resources above 0 (`device_plugin_resources`), the device plugin until no
ResourceSlice of the driver is left for the node (`slices_left`). The daemon entering its own mode
records `ModeSwitched` once it advertises; the one whose mode is in force records
`ModeSwitchRefused`, so each shows once per node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args

from msgspec import Struct

from nvdp.config.model import Config, Mode
from nvdp.config.names import DEFAULT_DRA_DRIVER as DEFAULT_DRA_DRIVER
from nvdp.config.names import DEFAULT_MODE_ENV as DEFAULT_MODE_ENV
from nvdp.config.names import DRA_DRIVER_ENV as DRA_DRIVER_ENV
from nvdp.daemon.pernode.nodechoice import ConfigPending, ConfigRefused, Report

if TYPE_CHECKING:
    from nvdp.inventory.model import Inventory

__all__ = ["KubeletClaim", "KubeletPod", "KubeletPods", "Mode", "ModeGate", "ModeSwitchRefused",
           "node_mode"]

MODES: tuple[Mode, ...] = get_args(Mode)
DRIVER_ENV = DRA_DRIVER_ENV
DEFAULT_DRIVER = DEFAULT_DRA_DRIVER
RESOURCE_PREFIX = "nvidia.com/"
DONE_PHASES = ("Succeeded", "Failed")
# How many GPU pods a refusal names.
NAMED_PODS = 5
# While one API waits for the other to let go, it looks this often.
HANDOVER_POLL_S = 1.0
# ... and says what it waits for this often.
HANDOVER_LOG_S = 30.0


class InvalidMode(ConfigRefused):
    """NVDP_DEFAULT_MODE holds something other than a mode."""


class ModeSwitchRefused(ConfigPending):
    """A mode switch while GPU pods run on the node; tried again until they are gone."""

    reason = "ModeSwitchRefused"


def default_mode(env: Mapping[str, str]) -> Mode:
    """The mode of a config without `flags.mode`: env NVDP_DEFAULT_MODE, else "device-plugin"."""
    raw = env.get(DEFAULT_MODE_ENV, "").strip()
    if not raw:
        return "device-plugin"
    for mode in MODES:
        if raw == mode:
            return mode
    raise InvalidMode(f"{DEFAULT_MODE_ENV} is {raw!r}; set it to device-plugin or dra (chart value "
                      f"dra.defaultMode), or set flags.mode in the config")


def node_mode(config: Config, env: Mapping[str, str]) -> Mode:
    """The mode `config` puts a node in; raises InvalidMode for a bad NVDP_DEFAULT_MODE."""
    mode = config.flags.mode
    return mode if mode is not None else default_mode(env)


def follower_mode(config: Config, env: Mapping[str, str]) -> Mode:
    """The mode for the daemons beside the DRA plugin (device plugin, MPS daemon, labeller): DRA mode
    needs a DRA plugin deployed (the chart sets DRA_DRIVER_NAME and NVDP_DEFAULT_MODE with
    dra.enabled); without one the config is refused, as the chart refuses such an entry at install."""
    mode = node_mode(config, env)
    problem = strategy_problem(config, mode)
    if problem is not None:
        raise InvalidMode(problem)
    if mode == "dra" and driver_name(env) is None and not env.get(DEFAULT_MODE_ENV, "").strip():
        raise InvalidMode(f"{config.source}: flags.mode is dra, but no DRA plugin runs beside this daemon "
                          f"({DRIVER_ENV} and {DEFAULT_MODE_ENV} are unset: the chart's dra.enabled is "
                          "false); set dra.enabled=true, or remove flags.mode from the entry")
    return mode


def strategy_problem(config: Config, mode: Mode) -> str | None:
    """Why `config` cannot run in `mode`, with the fix; None when it can. migStrategy dynamic makes MIG
    devices when a claim is prepared, which only the DRA plugin does: the device plugin refuses it."""
    if config.flags.mig_strategy == "dynamic" and mode == "device-plugin":
        how = ("flags.mode is device-plugin" if config.flags.mode == "device-plugin" else
               f"the node's default mode is device-plugin ({DEFAULT_MODE_ENV}, chart value dra.defaultMode)")
        return (f"{config.source}: flags.migStrategy dynamic needs DRA mode, but {how}: the device plugin "
                "cannot make MIG devices on demand; set flags.mode: dra in the entry (with "
                "dra.enabled=true), or use migStrategy single or mixed with MIG devices made beforehand")
    return None


def driver_name(env: Mapping[str, str]) -> str | None:
    """The DRA driver beside this daemon (env DRA_DRIVER_NAME, which the chart sets only with
    dra.enabled); None when no DRA plugin is deployed."""
    return env.get(DRIVER_ENV, "").strip() or None


# --- which pods use the node's GPUs (plain functions over the API's JSON) ------------------------


class GpuPod(Struct, frozen=True):
    """A pod that holds GPUs of this node, and through what."""

    namespace: str
    name: str
    uses: str  # "nvidia.com/gpu", or "claim <name>"
    pod: bool = True  # False: a claim allocated here that no pod on the node holds yet

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uses})"


def _quantity_above_zero(value: object) -> bool:
    """A quantity's number part has a digit other than 0 ("1", "10", "500m"; not "0", "0.0", "0m")."""
    number = str(value).strip().rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    return any(ch in "123456789" for ch in number)


def extended_resources(pod: Mapping[str, Any]) -> list[str]:
    """The `nvidia.com/*` extended resources a pod's containers or init containers ask for (> 0)."""
    spec = pod.get("spec") or {}
    found: list[str] = []
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for key in ("limits", "requests"):
            for name, value in (resources.get(key) or {}).items():
                if name.startswith(RESOURCE_PREFIX) and _quantity_above_zero(value) and name not in found:
                    found.append(name)
    return found


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims (in the pod's namespace) a pod references: named in spec.resourceClaims,
    generated from a template (status.resourceClaimStatuses), or made for its extended resources
    (status.extendedResourceClaimStatus)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    names: list[str] = []
    for ref in spec.get("resourceClaims") or []:
        names.append(ref.get("resourceClaimName") or "")
    for ref in status.get("resourceClaimStatuses") or []:
        names.append(ref.get("resourceClaimName") or "")
    extended = status.get("extendedResourceClaimStatus") or {}
    names.append(extended.get("resourceClaimName") or "")
    return list(dict.fromkeys(name for name in names if name))


class KubeletClaim(Struct, frozen=True):
    """A claim a container holds, as the kubelet's pod-resources API names it: the (driver, pool) of
    each device prepared for it."""

    namespace: str
    name: str
    devices: tuple[tuple[str, str], ...] = ()


class KubeletPod(Struct, frozen=True):
    """A pod the kubelet runs (its pod-resources answer, active pods only): the device-plugin resources
    its containers were given devices of, and the claims they hold."""

    namespace: str
    name: str
    resources: tuple[str, ...] = ()
    claims: tuple[KubeletClaim, ...] = ()


# The kubelet's answer, asked once per call (nvdp.daemon.podresources.client.node_pods); raises when the
# kubelet cannot be asked.
KubeletPods = Callable[[], "Sequence[KubeletPod]"]


def kubelet_gpu_pods(pods: Iterable[KubeletPod], *, driver: str | None, node: str) -> list[GpuPod]:
    """The pods the kubelet runs that use this node's GPUs: given devices of an `nvidia.com/*` resource,
    or holding a claim with a device of `driver` from this node's pool (the pool is the node's name).
    The kubelet lists only pods it has admitted and not yet finished, so no phase is looked at."""
    found: list[GpuPod] = []
    for pod in pods:
        resources = list(dict.fromkeys(r for r in pod.resources if r.startswith(RESOURCE_PREFIX)))
        if resources:
            found.append(GpuPod(pod.namespace, pod.name, ", ".join(resources)))
            continue
        if driver is None:
            continue
        for claim in pod.claims:
            if (driver, node) in claim.devices:
                found.append(GpuPod(pod.namespace, pod.name, f"claim {claim.name}"))
                break
    return found


def claim_on_node(claim: Mapping[str, Any] | None, *, driver: str, node: str) -> bool:
    """Whether a claim holds a device of `driver` from this node's pool (the pool is the node's name)."""
    from nvdp.claim_results import allocation_results

    return any(r.get("driver") == driver and r.get("pool") == node for _, r in allocation_results(claim))


ClaimLookup = Callable[[str, str], "Mapping[str, Any] | None"]


def gpu_pods(pods: Iterable[Mapping[str, Any]], get_claim: ClaimLookup | None, *, driver: str | None,
             node: str) -> list[GpuPod]:
    """The pods (bound to `node`) that use its GPUs through either API. `get_claim(namespace, name)`
    reads a claim (None: deleted); without it or a driver, claims are not looked at."""
    found: list[GpuPod] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if status.get("phase") in DONE_PHASES:
            continue
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        resources = extended_resources(pod)
        if resources:
            found.append(GpuPod(namespace, name, ", ".join(resources)))
            continue
        if get_claim is None or driver is None:
            continue
        for claim in claim_names(pod):
            if claim_on_node(get_claim(namespace, claim), driver=driver, node=node):
                found.append(GpuPod(namespace, name, f"claim {claim}"))
                break
    return found


def refusal(current: Mode, wanted: Mode, pods: Sequence[GpuPod]) -> str:
    """Why the switch waits, the pods (up to NAMED_PODS) and the fix."""
    named = ", ".join(p.describe() for p in pods[:NAMED_PODS])
    more = f" and {len(pods) - NAMED_PODS} more" if len(pods) > NAMED_PODS else ""
    one, many = ("pod", "pods") if all(p.pod for p in pods) else ("pod or claim", "pods or claims")
    count = f"1 {one} uses" if len(pods) == 1 else f"{len(pods)} {many} use"
    return (f"switching this node from {current} to {wanted} is refused while {count} its GPUs: "
            f"{named}{more}. Delete or drain them; the node switches by itself once they are gone")


# --- the API side -------------------------------------------------------------------------------


# The device plugin's resource names without renames: whole GPUs, shared GPUs (renameByDefault),
# MIG devices (mixed strategy).
DEVICE_PLUGIN_NAMES = ("nvidia.com/gpu",)
DEVICE_PLUGIN_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/mig-")


def planned_resources(config: Config, inventory: Inventory) -> frozenset[str]:
    """The resources the device plugin would advertise under `config` (its renames included)."""
    from nvdp.plan import PlanError, plan

    try:
        return frozenset(resource.name for resource in plan(config, inventory).resources)
    except PlanError:
        return frozenset()


def device_plugin_resources(allocatable: Mapping[str, str], planned: Collection[str] = ()) -> list[str]:
    """The device plugin's resources a Node's allocatable shows above 0 ("nvidia.com/gpu=4"): its
    default names and `planned`. Other `nvidia.com/*` resources (a network operator's) are not ours."""
    def ours(name: str) -> bool:
        return name in DEVICE_PLUGIN_NAMES or name.startswith(DEVICE_PLUGIN_PREFIXES) or name in planned

    return [f"{name}={value}" for name, value in sorted(allocatable.items())
            if ours(name) and _quantity_above_zero(value)]


UNBOUND = "a claim allocated here, its pod not bound yet"
UNHELD = "a claim allocated here, no container on the node holds it yet"


def unbound_claims(claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], *, driver: str,
                   node: str) -> list[GpuPod]:
    """Claims allocated from this node's pool that no pod bound to the node references: the scheduler
    allocated them and is binding their pod here (or just did)."""
    referenced = {(str((pod.get("metadata") or {}).get("namespace", "")), claim)
                  for pod in pods for claim in claim_names(pod)}
    return _claims_left(claims, referenced, driver=driver, node=node, why=UNBOUND)


def unheld_claims(claims: Iterable[Mapping[str, Any]], pods: Iterable[KubeletPod], *, driver: str,
                  node: str) -> list[GpuPod]:
    """Claims allocated from this node's pool that no container the kubelet runs holds: their pod is on
    its way (being bound, or admitted and not started), or names the claim in no container."""
    held = {(claim.namespace, claim.name) for pod in pods for claim in pod.claims}
    return _claims_left(claims, held, driver=driver, node=node, why=UNHELD)


def _claims_left(claims: Iterable[Mapping[str, Any]], seen: Collection[tuple[str, str]], *, driver: str,
                 node: str, why: str) -> list[GpuPod]:
    found = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if key not in seen and claim_on_node(claim, driver=driver, node=node):
            found.append(GpuPod(*key, why, pod=False))
    return found


class NodeApi:
    """What the mode policy reads about one node: from the API server (through nvdp.kube) and, where
    given, the pods from the kubelet.

    `kubelet_pods`: the kubelet's pod-resources answer; with it the pods using the GPUs come from the
    kubelet, and no pod is listed through the API (nor a claim read). Without it, the pods bound to the
    node are listed through the API and their claims read.
    `all_claims`: also list every ResourceClaim, for claims allocated from this node's pool that no pod
    on the node holds yet (the DRA plugin, which may list claims, leaving DRA mode).
    """

    def __init__(self, client: Any, node: str, driver: str | None, *, all_claims: bool = False,
                 kubelet_pods: KubeletPods | None = None) -> None:
        self.client = client
        self.node = node
        self.driver = driver
        self.all_claims = all_claims
        self.kubelet_pods = kubelet_pods

    def gpu_pods(self) -> list[GpuPod]:
        from nvdp.kube import get_claim, list_claims, list_node_pods

        client = self.client
        if self.kubelet_pods is not None:
            running = self.kubelet_pods()
            found = kubelet_gpu_pods(running, driver=self.driver, node=self.node)
            if self.all_claims and self.driver is not None:
                found += unheld_claims(list_claims(client), running, driver=self.driver, node=self.node)
            return found
        pods = list_node_pods(client, self.node)
        found = gpu_pods(pods, lambda ns, name: get_claim(client, ns, name), driver=self.driver,
                         node=self.node)
        if self.all_claims and self.driver is not None:
            found += unbound_claims(list_claims(client), pods, driver=self.driver, node=self.node)
        return found

    def allocatable(self) -> dict[str, str]:
        """The Node's allocatable, as the kubelet last reported it."""
        from nvdp.kube import get_node_allocatable

        return get_node_allocatable(self.client, self.node)

    def slices_left(self) -> int:
        """The ResourceSlices of the driver for this node (the DRA plugin still publishes)."""
        from nvdp.kube import list_slices

        if self.driver is None:
            return 0
        return len(list_slices(self.client, node=self.node, driver=self.driver))


def _api_problem(err: Exception) -> str:
    from nvdp.kube import classify

    failure = classify(err)
    if failure.kind == "status" and failure.code == 403:
        return (f"{failure.code} {failure.detail}: the service account lacks a right the chart grants with "
                "dra.enabled (for the DRA plugin resourceclaims list; without the kubelet's pod-resources "
                "socket, KUBELET_POD_RESOURCES_SOCKET, pods list and resourceclaims get)")
    return f"{failure.code} {failure.detail}" if failure.kind == "status" else failure.detail


class ModeGate:
    """One daemon's mode in force and the switch policy.

    `own`: the mode in which this daemon advertises ("device-plugin" for the device plugin, "dra" for
    the DRA plugin; None for the labeller and the MPS daemon, which follow and never record Events).
    `api`: None without API access (a mode switch then needs a restart). `per_node`: whether entries
    are chosen per node (without, a new mode can only come from SIGHUP, and needs a restart).
    """

    def __init__(self, own: Mode | None, api: NodeApi | None, report: Report, log: logging.Logger, *,
                 per_node: bool = True) -> None:
        self.own = own
        self.api = api
        self.per_node = per_node
        self._report = report
        self._log = log
        self.mode: Mode | None = None
        self._switched_from: Mode | None = None

    def check(self, wanted: Mode) -> bool:
        """Before a config goes in: whether it switches the mode. Raises ModeSwitchRefused while GPU
        pods run (or they cannot be listed), ConfigRefused when this daemon cannot check."""
        current = self.mode
        if current is None or wanted == current:
            return False
        if self.api is None or not self.per_node:
            raise ConfigRefused(
                f"the config switches this node from {current} to {wanted}, which a running daemon does "
                f"only with per-node config and API access (it must see that no pod uses the GPUs); "
                f"restart the pods on this node to switch, or keep flags.mode {current}")
        notify = self.own is not None and self.own == current
        try:
            pods = self.api.gpu_pods()
        except Exception as err:
            raise ModeSwitchRefused(
                f"switching this node from {current} to {wanted} waits: the pods on the node cannot be "
                f"listed ({_api_problem(err)})", notify=notify) from None
        if pods:
            raise ModeSwitchRefused(refusal(current, wanted, pods), notify=notify)
        return True

    def enter(self, mode: Mode) -> None:
        """The config with `mode` is in force (after `check`)."""
        if self.mode is not None and mode != self.mode:
            self._log.info("Mode: switching this node from %s to %s", self.mode, mode)
            self._switched_from = self.mode
        elif self.mode is None:
            self._log.info("Mode: %s", mode)
        self.mode = mode

    def advertising(self) -> None:
        """This daemon advertises in its own mode now: the switch, if one led here, is done."""
        previous, self._switched_from = self._switched_from, None
        if previous is not None and self.mode == self.own and previous != self.mode:
            self._report("ModeSwitched", f"{previous} -> {self.mode}", warning=False)


class Handover:
    """Polled from a daemon's loop until the other API has let go of this node's GPUs.

    `held()` says what is still held ("nvidia.com/gpu: 1 allocatable"), or None once nothing is.
    """

    def __init__(self, what: str, held: Callable[[], str | None], log: logging.Logger, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what  # "the device plugin to withdraw"
        self._held = held
        self._log = log
        self._clock = clock
        self.started = clock()
        self._logged_at: float | None = None

    def done(self) -> bool:
        """Look once; True when nothing is held any more."""
        try:
            holding = self._held()
        except Exception as err:
            holding = f"cannot read it ({_api_problem(err)})"
        now = self._clock()
        if holding is None:
            if self._logged_at is not None:
                self._log.info("Done waiting for %s after %.1f s", self.what, now - self.started)
            return True
        if self._logged_at is None or now - self._logged_at >= HANDOVER_LOG_S:
            self._logged_at = now
            self._log.info("Waiting for %s (%.0f s so far): %s", self.what, now - self.started, holding)
        return False
