"""The doctor's DRA checks, on a node that runs the DRA kubelet plugin (`nvidia-dra-plugin`):

- registration: the registration socket answers GetInfo as the kubelet's plugin watcher asks it
  (type DRAPlugin, this driver's name, a DRA API version the kubelet speaks), and the endpoint it
  names exists and answers NodePrepareResources (asked with no claims, which changes nothing);
- slices: the API server holds this node's ResourceSlices of the driver, the pool is complete at its
  newest generation (as many slices as `resourceSliceCount`), and its devices are the ones this
  node's GPUs give (`nvdp.dra.pool.devices.dra_devices`), each with the GPU's UUID.

A node runs the DRA plugin when its registration socket exists or the environment names a driver
(`DRA_DRIVER_NAME`, set by the chart's DRA DaemonSet); elsewhere the check is one SKIP line saying so.
Where it runs, the node's mode (nvdp.daemon.pernode.mode: the entry's `flags.mode`, else `NVDP_DEFAULT_MODE`,
else
DRA) says what to expect: in DRA mode the slices above; in device-plugin mode none (the device plugin
serves the GPUs, and slices too would offer them twice).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from msgspec import Struct

from nvdp.config.model import Config, Mode
from nvdp.doctor.report import Finding, failed, passed, skipped
from nvdp.doctor.where import Where
from nvdp.inventory.model import Inventory
from nvdp.text import short_list

TITLE = "the DRA kubelet plugin"
REGISTRATION_TITLE = "the DRA plugin answers the kubelet's registration and DRA calls"
SLICES_TITLE = "this node's ResourceSlices hold its GPUs"
NO_SLICES_TITLE = "no ResourceSlices in device-plugin mode"
# One gRPC call (GetInfo, NodePrepareResources) waits at most this long, within the check's limit.
CALL_TIMEOUT_S = 5.0

FIX_NOT_RUNNING = (
    "check that the DRA plugin pod runs on this node (`kubectl -n <namespace> get pods -o wide "
    "--field-selector spec.nodeName=<node>`, its log with `kubectl logs`), and that its "
    "kubeletRegistrarDir / kubeletPluginsDir (env KUBELET_REGISTRAR_DIR / KUBELET_PLUGINS_DIR, chart "
    "values dra.kubeletRegistrarDir / dra.kubeletPluginsDir) are the kubelet's folders (k3s: "
    "/var/lib/rancher/k3s/agent/kubelet/...)"
)
FIX_LOG = "read the DRA plugin's log (`kubectl logs <dra plugin pod>`): it says why it does not serve; " \
          "deleting the pod restarts it with fresh sockets"
FIX_MISSING = (
    "the kubelet wipes a node's slices when it starts; the plugin re-publishes within seconds - if they "
    "stay missing, check the plugin's log (`kubectl logs <dra plugin pod>`: 'Cannot publish') and that "
    "its service account may create resourceslices (the chart's DRA ClusterRole, and the admission "
    "policy that allows only slices whose spec.nodeName is the plugin's own node)"
)
FIX_INCOMPLETE = (
    "the plugin writes every slice of a new generation at once; a pool that stays incomplete means a "
    "write failed: see the plugin's log ('Cannot publish'); deleting the slices (`kubectl delete "
    "resourceslices --field-selector spec.nodeName=<node>,spec.driver=<driver>`) makes it publish "
    "them again"
)
FIX_UNHEALTHY = (
    "a device leaves the pool while the plugin holds its GPU down (an XID, a GPU fallen off the bus) and "
    "returns by itself when the GPU recovers: `nvdp health` in the DRA plugin's container says which "
    "GPU, why and what brings it back (the quiet period, a reset with `nvidia-smi -r`, or `nvdp health "
    "clear` for a flapping one); the node's Events (`kubectl describe node <node>`) tell the same"
)
FIX_TAINTED = (
    "a device stays in the pool tainted while the plugin holds its GPU down, and its taints go when the "
    "GPU recovers: each device above says what brings it back; `nvdp health` in the DRA plugin's "
    "container names the GPU and its fault, and a claim that tolerates the taint (a diagnostics pod) may "
    "still use it (docs/dra.md, 'When a GPU goes down')"
)
FIX_BOTH = (
    "in device-plugin mode the DRA plugin deletes this node's slices: see its log ('This node is in "
    "device-plugin mode', 'Cannot delete'); if the node should be in DRA mode, check its entry's "
    "flags.mode and the label nvidia.com/device-plugin.config"
)
FIX_STALE = (
    "the slices describe other devices than this node's GPUs give now (GPUs changed, MIG reconfigured): "
    "send the plugin SIGHUP or restart its pod, so it reads the GPUs again and publishes them"
)


class DraNode(Struct, frozen=True):
    """Where this node's DRA plugin would be, and whether it runs here (`why`: how that was decided)."""

    driver: str
    registration_socket: str
    plugin_socket: str
    on: bool
    why: str

    @property
    def checkpoint(self) -> str:
        """The plugin's checkpoint (beside its socket): which MIG devices it made (migStrategy dynamic)."""
        from nvdp.dra.claims.checkpoint import CHECKPOINT_FILE

        return os.path.join(os.path.dirname(self.plugin_socket), CHECKPOINT_FILE)


def dra_node(env: Mapping[str, str]) -> DraNode:
    """The DRA plugin's driver and sockets as `nvidia-dra-plugin` takes them from `env`, and whether it
    runs on this node: its registration socket exists, or DRA_DRIVER_NAME is set."""
    from nvdp.dra.kubelet.server import newest_instance, plugin_socket_path, registration_socket_path
    from nvdp.dra.main import (
        DEFAULT_PLUGINS_DIR,
        DEFAULT_REGISTRAR_DIR,
        DRIVER_ENV,
        INSTANCE_ENV,
        PLUGINS_DIR_ENV,
        REGISTRAR_DIR_ENV,
    )
    from nvdp.dra.pool.names import DEFAULT_DRIVER

    driver = env.get(DRIVER_ENV) or DEFAULT_DRIVER
    registrar = env.get(REGISTRAR_DIR_ENV) or DEFAULT_REGISTRAR_DIR
    plugins = env.get(PLUGINS_DIR_ENV) or DEFAULT_PLUGINS_DIR
    # In the plugin's pod its own sockets (named after the pod); elsewhere the newest instance's.
    instance = env.get(INSTANCE_ENV) or newest_instance(registrar, driver)
    registration = registration_socket_path(registrar, driver, instance)
    plugin = plugin_socket_path(os.path.join(plugins, driver), instance)
    if os.path.exists(registration):
        on, why = True, f"{registration} exists"
    elif env.get(DRIVER_ENV):
        on, why = True, f"{DRIVER_ENV} is {driver}"
    else:
        on, why = False, (f"this node runs no DRA plugin: no {registration} and {DRIVER_ENV} is not set "
                          f"(set {DRIVER_ENV}, {REGISTRAR_DIR_ENV} and {PLUGINS_DIR_ENV} as the plugin "
                          "has them to check a plugin elsewhere)")
    return DraNode(driver, registration, plugin, on, why)


def node_mode(config: Config, env: Mapping[str, str], node: DraNode) -> Mode:
    """The node's mode as the daemons take it (nvdp.daemon.pernode.mode), except that a node running the DRA
    plugin
    with no mode set anywhere is a DRA node (a DRA plugin deployed without the device plugin)."""
    from nvdp.daemon.pernode.mode import DEFAULT_MODE_ENV, InvalidMode, default_mode

    if config.flags.mode is not None:
        return config.flags.mode
    if env.get(DEFAULT_MODE_ENV, "").strip():
        try:
            return default_mode(env)
        except InvalidMode:
            pass  # the daemons refuse it and say so; the doctor goes by what runs
    return "dra" if node.on else "device-plugin"


class DraChecks:
    where: Where
    inventory: Inventory | None
    config: Config = Config()
    # The kubeconfig for the slices' API read; None: the pod's service account, else KUBECONFIG.
    dra_kubeconfig: str | None = None

    def dra(self) -> list[Finding]:
        """Registration and slices on a DRA node; nothing on a node without the DRA plugin (as the CDI
        checks are only there with a CDI strategy)."""
        node = dra_node(self.where.env)
        if not node.on:
            return []
        timeout = min(self.where.timeout, CALL_TIMEOUT_S)
        if node_mode(self.config, self.where.env, node) == "device-plugin":
            return [dra_registration(node, timeout), dra_no_slices(node, self.where.node_name,
                                                                   self.dra_kubeconfig)]
        found = [
            dra_registration(node, timeout),
            dra_slices(node, self.where.node_name, self.dra_kubeconfig, self.inventory, self.config),
        ]
        if self.config.flags.mig_strategy == "dynamic" and self.inventory is not None:
            found.append(dynamic_mig(self.inventory, node, self.config))
            found.append(dynamic_mig_scale(self.config, self.inventory, node, self.where.env,
                                           self.dra_kubeconfig))
        return found


def dynamic_mig(inventory: Inventory, node: DraNode, config: Config | None = None) -> Finding:
    """migStrategy dynamic: whether every MIG-capable GPU can have MIG devices made on demand (MIG mode
    on, or switchable without a reset), and MIG devices the plugin did not make; the plugin's own
    words (nvdp.dra.pool.contents.dynamic_warnings)."""
    from nvdp.dra.claims.checkpoint import read_owned_mig
    from nvdp.dra.pool.contents import dynamic_warnings, foreign_instances
    from nvdp.dra.pool.partitions import Offers, partitions_published

    title = "Dynamic MIG"
    offers = Offers(config.flags.mig_dynamic_profiles if config is not None else None)
    warnings = dynamic_warnings(inventory, foreign_instances(inventory, read_owned_mig(node.checkpoint).owns),
                                offers)
    if warnings:
        return failed("dra-mig", title, " ".join(warnings), "the fix is named with each GPU above")
    ready = [g.index for g in inventory.gpus if partitions_published(g)]
    return passed("dra-mig", title, f"MIG devices are made on demand on GPU(s) {ready or 'none'}")


SCALE_TITLE = "the cluster's scheduler copes with dynamic MIG"


def dynamic_mig_scale(config: Config, inventory: Inventory, node: DraNode, env: Mapping[str, str],
                      kubeconfig: str | None) -> Finding:
    """migStrategy dynamic: whether the control plane's kube-scheduler has the partitionable-devices fix,
    by the API server's version; the DRA plugin's own warning (nvdp.dra.pool.scale) where it lacks it."""
    from nvdp.dra.claims.checkpoint import read_owned_mig
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.scale import (
        SCHEDULER_FIX_TEXT,
        SILENCE_ENV,
        SILENCE_VALUE,
        in_force,
        scale_warning,
        silenced,
    )
    from nvdp.kube import KubeConnectError, classify, connect, get_server_version
    from nvdp.plan import PlanError

    check = "dra-mig-scale"
    try:
        count = in_force(config, "dra", pool_devices(config, inventory, read_owned_mig(node.checkpoint).owns))
    except PlanError as err:
        return skipped(check, SCALE_TITLE, f"the config cannot be applied to this node's GPUs: {err}")
    if not count:
        return passed(check, SCALE_TITLE, "this node publishes no shared counters (no MIG-capable GPU)")
    if silenced(env):
        return passed(check, SCALE_TITLE, f"not checked: {SILENCE_ENV}=false ({SILENCE_VALUE})")
    try:
        version = get_server_version(connect(kubeconfig))
    except KubeConnectError as err:
        return skipped(check, SCALE_TITLE, f"cannot read the API server's version: {err}")
    except Exception as err:  # every API failure is a report line
        failure = classify(err)
        return skipped(check, SCALE_TITLE, f"cannot read the API server's version ({failure.kind}: "
                                           f"{failure.detail})")
    message = scale_warning(version.text, version.release, count)
    if message is not None:
        return failed(check, SCALE_TITLE, message,
                      f"upgrade the control plane to Kubernetes {SCHEDULER_FIX_TEXT} or later; or list fewer "
                      "profiles in flags.migDynamicProfiles; or, on a small cluster, set "
                      f"{SILENCE_VALUE}=false")
    if version.release is None:
        return skipped(check, SCALE_TITLE, f"the API server reports version {version.text!r}, which nvdp "
                                           "does not read")
    return passed(check, SCALE_TITLE, f"Kubernetes {version.text} has the scheduler's partitionable-devices "
                                      f"fix ({SCHEDULER_FIX_TEXT} or later); {count} partitionable devices "
                                      "here")


# --- registration --------------------------------------------------------------------------------------


def _rpc_problem(err: Exception, path: str, call: str) -> str:
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    name = code().name if callable(code) else type(err).__name__
    text = details() if callable(details) else str(err)
    return f"{path} does not answer {call} ({name}: {text})"


def dra_registration(node: DraNode, timeout: float) -> Finding:
    """The registration socket answers GetInfo as the kubelet expects; its endpoint answers DRA calls."""
    from nvdp.daemon.grpc_import import grpc
    from nvdp.dra.kubelet.api import pluginregistration_v1_pb2 as reg_pb
    from nvdp.dra.kubelet.server import PLUGIN_TYPE, SUPPORTED_VERSIONS
    from nvdp.plugin.grpc_client import fresh_channel

    check, path = "dra-registration", node.registration_socket
    if not os.path.exists(path):
        return failed(check, REGISTRATION_TITLE, f"no registration socket {path} ({node.why})",
                      FIX_NOT_RUNNING)
    try:
        with fresh_channel(path) as channel:
            info = _registration_stub(channel).GetInfo(reg_pb.InfoRequest(), timeout=timeout)
    except grpc.RpcError as err:
        return failed(check, REGISTRATION_TITLE, _rpc_problem(err, path, "GetInfo"), FIX_LOG)
    problems = []
    if info.type != PLUGIN_TYPE:
        problems.append(f"GetInfo says type {info.type!r}, not {PLUGIN_TYPE!r}")
    if info.name != node.driver:
        problems.append(f"GetInfo says driver {info.name!r}, not {node.driver!r}")
    versions = [v for v in SUPPORTED_VERSIONS if v in info.supported_versions]
    if not versions:
        problems.append(f"GetInfo offers versions {list(info.supported_versions)}, none of "
                        f"{', '.join(SUPPORTED_VERSIONS)}")
    if problems:
        return failed(check, REGISTRATION_TITLE, f"{path}: {'; '.join(problems)}",
                      f"another plugin holds this driver's socket name; stop it, or give nvidia-dra-plugin "
                      f"its own driver name (DRA_DRIVER_NAME); {FIX_LOG}")
    endpoint = info.endpoint
    if not os.path.exists(endpoint):
        return failed(check, REGISTRATION_TITLE,
                      f"GetInfo names the endpoint {endpoint}, which does not exist",
                      "the kubelet calls the endpoint at that path on the node: the plugin's kubelet "
                      "plugins folder must be mounted at the same path as on the node (chart value "
                      f"dra.kubeletPluginsDir); {FIX_LOG}")
    problem = _prepare_nothing(endpoint, versions[0], timeout)
    if problem is not None:
        return failed(check, REGISTRATION_TITLE, problem, FIX_LOG)
    elsewhere = ("" if endpoint == node.plugin_socket
                 else f" (not {node.plugin_socket}: the plugin's KUBELET_PLUGINS_DIR differs from this one)")
    return passed(check, REGISTRATION_TITLE,
                  f"{path}: {PLUGIN_TYPE} {node.driver} ({', '.join(versions)}); endpoint {endpoint}"
                  f"{elsewhere} answers NodePrepareResources")


def _registration_stub(channel: Any) -> Any:
    from nvdp.dra.kubelet.api import pluginregistration_v1_pb2_grpc

    stub: Any = pluginregistration_v1_pb2_grpc
    return stub.RegistrationStub(channel)


def _prepare_nothing(endpoint: str, version: str, timeout: float) -> str | None:
    """None when `endpoint` answers NodePrepareResources with no claims (a no-op), else why not."""
    from nvdp.daemon.grpc_import import grpc
    from nvdp.dra.kubelet.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
    from nvdp.plugin.grpc_client import fresh_channel

    api: Any = dra_v1_pb2 if version.startswith("v1.") else dra_v1beta1_pb2
    stubs: Any = dra_v1_pb2_grpc if version.startswith("v1.") else dra_v1beta1_pb2_grpc
    try:
        with fresh_channel(endpoint) as channel:
            answer = stubs.DRAPluginStub(channel).NodePrepareResources(
                api.NodePrepareResourcesRequest(), timeout=timeout)
    except grpc.RpcError as err:
        return _rpc_problem(err, endpoint, f"NodePrepareResources ({version})")
    if answer.claims:
        return f"{endpoint} answers NodePrepareResources of no claims with {len(answer.claims)} claim(s)"
    return None


# --- slices --------------------------------------------------------------------------------------------


class _Pool(Struct, frozen=True):
    name: str
    generation: int
    slices: int  # at the newest generation
    expected: int  # resourceSliceCount at the newest generation (the largest, if they disagree)
    older: int  # slices of older generations (the scheduler ignores them)


def dra_slices(node: DraNode, node_name: str, kubeconfig: str | None, inventory: Inventory | None,
               config: Config | None = None) -> Finding:
    """The node's slices of the driver in the API server against the devices its GPUs give."""
    from nvdp.kube import KubeConnectError, connect, list_slices

    check = "dra-slices"
    if not node_name:
        return skipped(check, SLICES_TITLE,
                       "no node name to find the slices by (set NODE_NAME or --node-name)")
    try:
        client = connect(kubeconfig)
    except KubeConnectError as err:
        if str(err).startswith("no Kubernetes API configuration"):
            return skipped(check, SLICES_TITLE, f"cannot read the slices: {err}")
        return failed(check, SLICES_TITLE, f"cannot read the slices: {err}", "fix the kubeconfig named above")
    try:
        found = list_slices(client, node=node_name, driver=node.driver)
    except Exception as err:  # every API failure is a report line
        detail, fix = _api_problem(err)
        return failed(check, SLICES_TITLE, detail, fix)
    selector = f"spec.nodeName={node_name},spec.driver={node.driver}"
    if not found:
        return failed(check, SLICES_TITLE, f"no ResourceSlice with {selector}", FIX_MISSING)
    pools = _pools(found)
    incomplete = [f"pool {p.name} generation {p.generation} has {p.slices} of {p.expected} slice(s)"
                  for p in pools if p.slices != p.expected]
    if incomplete:
        return failed(check, SLICES_TITLE, "; ".join(incomplete), FIX_INCOMPLETE)
    published = _newest_devices(found, pools)
    where = ", ".join(f"pool {p.name} generation {p.generation}: {p.slices} slice(s)" for p in pools)
    older = sum(p.older for p in pools)
    if older:
        where += f" (and {older} of older generations, which the scheduler ignores)"
    if inventory is None:
        return skipped(check, SLICES_TITLE, f"{where}, {len(published)} device(s); not compared with this "
                                            "node's GPUs: NVML did not load (see above)")
    return _compare(check, where, published, _expected(config or Config(), inventory, node),
                    _newest_taints(found, pools))


def _expected(config: Config, inventory: Inventory, node: DraNode) -> dict[str, str]:
    """Device name -> UUID of what the plugin publishes for these GPUs, by the plugin's own functions
    (nvdp.dra.pool.contents; its checkpoint for the MIG devices it made under migStrategy dynamic); the bare
    devices when the config cannot be applied (the plugin then says why)."""
    from nvdp.dra.claims.checkpoint import read_owned_mig
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.devices import dra_devices
    from nvdp.plan import PlanError

    try:
        devices = pool_devices(config, inventory, read_owned_mig(node.checkpoint).owns)
    except PlanError:
        devices = dra_devices(inventory)
    return {d.name: d.uuid for d in devices}


def dra_no_slices(node: DraNode, node_name: str, kubeconfig: str | None) -> Finding:
    """In device-plugin mode: no slice of the driver for this node."""
    from nvdp.kube import KubeConnectError, connect, list_slices

    check = "dra-slices"
    if not node_name:
        return skipped(check, NO_SLICES_TITLE,
                       "no node name to find the slices by (set NODE_NAME or --node-name)")
    try:
        found = list_slices(connect(kubeconfig), node=node_name, driver=node.driver)
    except KubeConnectError as err:
        return skipped(check, NO_SLICES_TITLE, f"cannot read the slices: {err}")
    except Exception as err:  # every API failure is a report line
        detail, fix = _api_problem(err)
        return failed(check, NO_SLICES_TITLE, detail, fix)
    selector = f"spec.nodeName={node_name},spec.driver={node.driver}"
    if not found:
        return passed(check, NO_SLICES_TITLE, f"this node is in device-plugin mode and no ResourceSlice has "
                                              f"{selector}: the device plugin alone serves its GPUs")
    devices = sum(len(_spec(obj).get("devices") or ()) for obj in found)
    return failed(check, NO_SLICES_TITLE, f"this node is in device-plugin mode, but {len(found)} "
                  f"ResourceSlice(s) with {selector} offer {devices} device(s): its GPUs are offered through "
                  "both APIs", FIX_BOTH)


def _compare(check: str, where: str, published: Mapping[str, str], expected: Mapping[str, str],
             taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> Finding:
    from nvdp.dra.pool.taints import is_down, what_brings_back

    missing = [name for name in expected if name not in published]
    other = [f"{name} ({uuid or 'no uuid'}, this node's is {expected[name]})"
             for name, uuid in published.items() if name in expected and uuid != expected[name]]
    unknown = [name for name in published if name not in expected]
    problems, fixes = [], []
    if missing:
        problems.append(f"not published (unhealthy, or not yet read): "
                        f"{short_list(f'{n} ({expected[n]})' for n in missing)}")
        fixes.append(FIX_UNHEALTHY)
    if other or unknown:
        if other:
            problems.append(f"published with another GPU's UUID: {short_list(other)}")
        if unknown:
            problems.append(f"published but not on this node: {short_list(unknown)}")
        fixes.append(FIX_STALE)
    marked = {name: list(t) for name, t in (taints or {}).items() if t}
    down = [f"{name} ({what_brings_back(t)})" for name, t in marked.items() if is_down(t)]
    notes = [f"{name} ({what_brings_back(t)})" for name, t in marked.items() if not is_down(t)]
    if down:
        problems.append(f"tainted, kept from new claims: {short_list(down)}")
        fixes.append(FIX_TAINTED)
    noted = f"; tainted without effect: {short_list(notes)}" if notes else ""
    if problems:
        return failed(check, SLICES_TITLE, f"{where}; {'; '.join(problems)}{noted}", "; ".join(fixes))
    return passed(check, SLICES_TITLE, f"{where}; {len(expected)} device(s), as this node's GPUs give: "
                                       f"{short_list(expected)}{noted}")


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _pool(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    pool = _spec(obj).get("pool")
    return pool if isinstance(pool, Mapping) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _pools(found: Sequence[Mapping[str, Any]]) -> list[_Pool]:
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for obj in found:
        by_pool.setdefault(str(_pool(obj).get("name", "")), []).append(obj)
    pools = []
    for name, slices in sorted(by_pool.items()):
        generation = max(_int(_pool(s).get("generation")) for s in slices)
        newest = [s for s in slices if _int(_pool(s).get("generation")) == generation]
        expected = max(_int(_pool(s).get("resourceSliceCount")) for s in newest)
        pools.append(_Pool(name, generation, len(newest), expected, len(slices) - len(newest)))
    return pools


def _newest_devices(found: Sequence[Mapping[str, Any]], pools: Sequence[_Pool]) -> dict[str, str]:
    """Device name -> its `uuid` attribute, over the slices of each pool's newest generation."""
    newest = {(p.name, p.generation) for p in pools}
    devices: dict[str, str] = {}
    for obj in found:
        pool = _pool(obj)
        if (str(pool.get("name", "")), _int(pool.get("generation"))) not in newest:
            continue
        for device in _spec(obj).get("devices") or ():
            uuid = (device.get("attributes") or {}).get("uuid") or {}
            devices[str(device.get("name", ""))] = str(uuid.get("string", ""))
    return devices


def _newest_taints(found: Sequence[Mapping[str, Any]], pools: Sequence[_Pool]
                   ) -> dict[str, list[Mapping[str, Any]]]:
    """Device name -> its taints, over the slices of each pool's newest generation."""
    newest = {(p.name, p.generation) for p in pools}
    return {str(device.get("name", "")): list(device.get("taints") or ())
            for obj in found
            if (str(_pool(obj).get("name", "")), _int(_pool(obj).get("generation"))) in newest
            for device in _spec(obj).get("devices") or ()}


def _api_problem(err: Exception) -> tuple[str, str]:
    from nvdp.doctor.api import FIX_ADDRESS
    from nvdp.kube import classify

    failure = classify(err)
    if failure.kind == "status" and failure.code in (401, 403):
        return (f"the API server refused to list ResourceSlices ({failure.code}: {failure.detail})",
                "grant list on resourceslices (resource.k8s.io) to the identity used: the chart's DRA "
                "ClusterRole gives it to the plugin's service account, so run the doctor in the plugin pod")
    if failure.kind == "status" and failure.code == 404:
        return (f"the API server has no resource.k8s.io/v1 ResourceSlices ({failure.detail})",
                "DRA's v1 API needs Kubernetes 1.34 or later (or the resource.k8s.io/v1 API enabled)")
    if failure.kind == "status":
        return (f"listing ResourceSlices: the API server answered {failure.code}: {failure.detail}",
                FIX_ADDRESS)
    return f"cannot list ResourceSlices: {failure.kind}: {failure.detail}", FIX_ADDRESS
