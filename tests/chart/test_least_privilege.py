"""Least privilege: every right a pod of the chart gets comes with a configured feature that uses it.

For each of nine value sets the exact rights of each pod: privileged containers, added capabilities,
host namespaces, the host paths it writes and those it only reads, whether its service-account token
is mounted, and the API rules bound to its account. A right that appears without its feature fails
here. The chart README's "Rights by configuration" table states the same, and is checked against what
renders.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chart_helm import CHART_DIR, Manifest, Rendered, container, env, render, render_error

MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 10}\n"
LIST_STRATEGY_ENTRY = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: envvar\n"
MIG_ENTRY = "version: v1\nflags:\n  migStrategy: mixed\n"
DYNAMIC_ENTRY = "version: v1\nflags:\n  mode: dra\n  migStrategy: dynamic\n"
DEVICE_PLUGIN_MODE = "version: v1\nflags:\n  mode: device-plugin\n"
HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"

# The configurations of the README's table, by the names it gives them.
SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "one MPS entry": {"config": {"map": {"config": MPS_ENTRY}}},
    "one entry with only deviceListStrategy": {"config": {"map": {"config": LIST_STRATEGY_ENTRY}}},
    "CDI": {"deviceListStrategy": "cdi-cri", "nvidiaDriverRoot": "/run/nvidia/driver",
            "cdi": {"nvidiaHookPath": HOOK}},
    "GFD": {"gfd": {"enabled": True}},
    "DRA": {"dra": {"enabled": True}},
    "DRA with dynamic MIG": {"dra": {"enabled": True}, "config": {"map": {"dynamic": DYNAMIC_ENTRY}}},
    "per-node entries": {"config": {"map": {"plain": "version: v1\n", "mps": MPS_ENTRY, "mig": MIG_ENTRY},
                                    "default": "plain"}},
    "DRA beside per-node device-plugin entries": {
        "dra": {"enabled": True}, "gfd": {"enabled": True},
        "config": {"map": {"dra": "version: v1\nflags:\n  mode: dra\n", "classic": DEVICE_PLUGIN_MODE},
                   "default": "dra"}},
    "usage metrics": {"metrics": {"enabled": True, "usage": {"enabled": True}}},
    "usage metrics in DRA mode": {"dra": {"enabled": True},
                                  "metrics": {"enabled": True, "usage": {"enabled": True}}},
}

# DaemonSet name suffix -> the pod's name in the table.
PODS = {
    "": "device plugin",
    "-mps-control-daemon": "MPS daemon",
    "-gpu-feature-discovery": "GFD",
    "-dra-plugin": "DRA plugin",
    "-dra-mps": "DRA MPS daemon",
    "-gpu-presence": "presence check",
}
FULLNAME = "nvdp-nvidia-device-plugin"

Rules = frozenset[str]  # "resource: verb" items


@dataclass(frozen=True)
class Rights:
    privileged: frozenset[str] = frozenset()  # container names
    capabilities: frozenset[str] = frozenset()  # added, over all containers
    host: frozenset[str] = frozenset()  # "host PID", "host network"
    written: frozenset[str] = frozenset()  # host paths mounted writable by some container
    read: frozenset[str] = frozenset()  # host paths mounted read-only only
    token: bool = False
    rules: Rules = frozenset()


def rules(*items: str) -> Rules:
    """"resource: verb verb" strings -> the rule set."""
    return frozenset(f"{resource}: {verb}" for item in items
                     for resource, verbs in [item.split(": ")] for verb in verbs.split())  # fmt: skip


KUBELET = "/var/lib/kubelet/device-plugins"
HEALTH = "/run/nvidia/nvdp"
MPS = ("/run/nvidia/mps", "/run/nvidia/mps/shm")
PLUGIN_BASE = frozenset({KUBELET, HEALTH})
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
# mps.upgrade whenIdle (the default): a new MPS daemon pod asks the kubelet's pod-resources socket
# (read-only) which pods use MPS, and takes over only once none does.
MPS_DAEMON = Rights(privileged=frozenset({"mps-control-daemon-mounts", "mps-control-daemon-ctr"}),
                    host=frozenset({"host PID"}), written=frozenset(MPS), read=frozenset({POD_RESOURCES}))
# Node Events through a Role in the default namespace (where they live), created only.
NODE_CONFIG_RULES = rules("nodes: get list watch", "events: create")
GFD = Rights(read=frozenset({HEALTH}), token=True,
             rules=rules("nodes: get list watch patch", "events: create"))
DRA_MPS_DIR = "/run/nvidia/mps/gpu.nvidia.com"
# The DRA plugin orders the MPS daemons of its claims (its driver's folder of the MPS root only); no
# host PID, no privileged init container: the dra-mps DaemonSet of the MPS image runs them.
DRA = Rights(
    privileged=frozenset({"nvidia-dra-plugin-ctr"}),
    written=frozenset({"/var/lib/kubelet/plugins/gpu.nvidia.com", "/var/lib/kubelet/plugins_registry",
                       "/var/run/cdi", HEALTH, DRA_MPS_DIR}),
    read=frozenset({"/var/lib/kubelet/pod-resources", "/usr/bin/nvidia-ctk"}), token=True,
    # Claims' status: what each prepared device is (its UUID, for monitoring), this driver's entries of
    # claims on its own node only (the admission policy); Kubernetes 1.36 checks resourceclaims/driver.
    rules=rules("resourceclaims: get list watch", "resourceslices: get list watch create update delete",
                "nodes: get list watch", "events: create", "resourceclaims/status: patch",
                "resourceclaims/driver: associated-node:patch"),
)
# The daemons of DRA claims: privileged (compute mode, the tmpfs), host PID, no token.
DRA_MPS = Rights(privileged=frozenset({"dra-mps-mount-shm", "dra-mps-ctr"}), host=frozenset({"host PID"}),
                 written=frozenset({DRA_MPS_DIR, f"{DRA_MPS_DIR}/shm"}))

EXPECTED: dict[str, dict[str, Rights]] = {
    # No config, no API access, no capability: the kubelet's folder and the health file only.
    "defaults": {"device plugin": Rights(written=PLUGIN_BASE)},
    # MPS: the MPS folders in the plugin; the daemon privileged (compute mode, the tmpfs) with host PID.
    "one MPS entry": {"device plugin": Rights(written=PLUGIN_BASE | set(MPS)), "MPS daemon": MPS_DAEMON},
    # A flags block without migStrategy is not MIG: no SYS_ADMIN.
    "one entry with only deviceListStrategy": {"device plugin": Rights(written=PLUGIN_BASE)},
    # CDI: the spec folder written, the driver root and the hook file read.
    "CDI": {"device plugin": Rights(written=PLUGIN_BASE | {"/var/run/cdi"},
                                    read=frozenset({"/run/nvidia/driver", HOOK}))},
    "GFD": {"device plugin": Rights(written=PLUGIN_BASE), "GFD": GFD},
    "DRA": {"DRA plugin": DRA, "DRA MPS daemon": DRA_MPS},
    # A MIG device made for a claim goes into its status as every device does: no right of its own.
    "DRA with dynamic MIG": {"DRA plugin": DRA, "DRA MPS daemon": DRA_MPS},
    # The label chooses: Node reads and Events for both pods; the MIG entry adds SYS_ADMIN.
    "per-node entries": {
        "device plugin": Rights(capabilities=frozenset({"SYS_ADMIN"}), written=PLUGIN_BASE | set(MPS),
                                token=True, rules=NODE_CONFIG_RULES),
        "MPS daemon": Rights(privileged=MPS_DAEMON.privileged, host=MPS_DAEMON.host,
                             written=MPS_DAEMON.written, read=MPS_DAEMON.read, token=True,
                             rules=NODE_CONFIG_RULES),
    },
    # The node label may switch a node's mode: which pods use the GPUs from the kubelet's pod-resources
    # socket (read-only), never a pods list; the device plugin reads the DRA plugin's slices it waits on.
    "DRA beside per-node device-plugin entries": {
        "device plugin": Rights(written=PLUGIN_BASE, read=frozenset({POD_RESOURCES}), token=True,
                                rules=NODE_CONFIG_RULES | rules("resourceslices: list")),
        "GFD": Rights(read=frozenset({HEALTH, POD_RESOURCES}), token=True, rules=GFD.rules),
        "DRA plugin": DRA,
        "DRA MPS daemon": DRA_MPS,
    },
    # Per-pod GPU usage: the host's PIDs (whose a process on a GPU is, from its cgroup), and for the
    # device plugin the kubelet's pod-resources socket (read-only); the kubelet's device checkpoint is
    # in the folder it has anyway, the DRA plugin reads the claims it may read already.
    "usage metrics": {"device plugin": Rights(host=frozenset({"host PID"}), written=PLUGIN_BASE,
                                              read=frozenset({POD_RESOURCES}))},
    "usage metrics in DRA mode": {
        "DRA plugin": Rights(privileged=DRA.privileged, host=frozenset({"host PID"}), written=DRA.written,
                             read=DRA.read, token=True, rules=DRA.rules),
        "DRA MPS daemon": DRA_MPS,
    },
}


@functools.cache
def rendered(name: str) -> Rendered:
    return render(SETS[name])


def bound_rules(objects: list[Manifest]) -> dict[str, Rules]:
    """The rules bound to each service account, through (Cluster)RoleBindings."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("ClusterRole", "Role")}
    found: dict[str, set[str]] = {}
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            table = found.setdefault(subject["name"], set())
            for rule in role["rules"]:
                table.update(f"{resource}: {verb}"
                             for resource in rule["resources"] for verb in rule["verbs"])
    return {account: frozenset(items) for account, items in found.items()}


def pod_rights(daemonset: Manifest, bound: dict[str, Rules]) -> Rights:
    spec = daemonset["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
    privileged: set[str] = set()
    capabilities: set[str] = set()
    written: set[str] = set()
    mounted: set[str] = set()
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        context = c.get("securityContext") or {}
        if context.get("privileged"):
            privileged.add(c["name"])
        capabilities.update((context.get("capabilities") or {}).get("add") or [])
        for mount in c.get("volumeMounts", []):
            if mount["name"] in paths:
                mounted.add(paths[mount["name"]])
                if not mount.get("readOnly"):
                    written.add(paths[mount["name"]])
    host = {label for key, label in (("hostPID", "host PID"), ("hostNetwork", "host network"),
                                     ("hostIPC", "host IPC")) if spec.get(key)}  # fmt: skip
    token = spec.get("automountServiceAccountToken")
    assert isinstance(token, bool), f"{daemonset['metadata']['name']}: the token is decided, not defaulted"
    return Rights(frozenset(privileged), frozenset(capabilities), frozenset(host), frozenset(written),
                  frozenset(mounted - written), token,
                  bound.get(spec["serviceAccountName"], frozenset()) if token else frozenset())


def rights(name: str) -> dict[str, Rights]:
    """Each pod's rights in configuration `name`."""
    objects = rendered(name).objects
    bound = bound_rules(objects)
    found = {}
    for daemonset in rendered(name).find("DaemonSet"):
        suffix = daemonset["metadata"]["name"].removeprefix(FULLNAME)
        found[PODS[suffix]] = pod_rights(daemonset, bound)
    return found


@pytest.mark.parametrize("name", list(SETS))
def test_each_configuration_gives_exactly_the_rights_its_features_use(name: str) -> None:
    assert rights(name) == EXPECTED[name]


@pytest.mark.parametrize("name", list(SETS))
def test_no_account_has_rules_its_pods_cannot_use(name: str) -> None:
    """A role bound to an account whose pods mount no token is a right nobody should hold."""
    objects = rendered(name).objects
    specs = [ds["spec"]["template"]["spec"] for ds in rendered(name).find("DaemonSet")]
    with_token = {spec["serviceAccountName"] for spec in specs if spec["automountServiceAccountToken"]}
    assert set(bound_rules(objects)) <= with_token


# --- the facts behind the rights ------------------------------------------------------------------

def plugin_rights(values: dict[str, Any]) -> Rights:
    objects = render(values)
    return pod_rights(objects.one("DaemonSet", FULLNAME), bound_rules(objects.objects))


@pytest.mark.parametrize("flags", [
    "flags:\n  plugin:\n    deviceListStrategy: envvar\n",
    "flags:\n  failOnInitError: true\n",
    "flags:\n  migStrategy: none\n",
    "flags: {}\n",
    "flags:\n  plugin:\n    passDeviceSpecs: true\n",
])  # fmt: skip
def test_an_entry_without_a_mig_strategy_does_not_add_sys_admin(flags: str) -> None:
    plugin = container(render({"config": {"map": {"config": f"version: v1\n{flags}"}}}).one(
        "DaemonSet", FULLNAME), "nvidia-device-plugin-ctr")
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in env(plugin)
    # Beside an entry that does use MIG.
    mixed = {"config": {"map": {"a": f"version: v1\n{flags}", "b": MIG_ENTRY}, "default": "a"}}
    assert plugin_rights(mixed).capabilities == {"SYS_ADMIN"}


@pytest.mark.parametrize(("values", "written"), [
    ({}, set()),
    ({"deviceListStrategy": "envvar"}, set()),
    ({"deviceListStrategy": "cdi-annotations"}, {"/var/run/cdi"}),
    ({"deviceListStrategy": ["envvar", "cdi-cri"]}, {"/var/run/cdi"}),
    ({"config": {"map": {"c": "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n"}}},
     {"/var/run/cdi"}),
    # The value overrides the entries (its env var wins), both ways.
    ({"deviceListStrategy": "envvar",
      "config": {"map": {"c": "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n"}}}, set()),
    # An existing ConfigMap cannot be read: CDI counts as possible.
    ({"config": {"name": "mine", "default": "c"}}, {"/var/run/cdi"}),
    ({"config": {"map": {"c": MPS_ENTRY}}}, set(MPS)),
    ({"mps": {"enabled": True}}, set(MPS)),
    ({"mps": {"enabled": False}, "config": {"map": {"c": MPS_ENTRY}}}, set()),
])  # fmt: skip
def test_the_plugin_writes_the_cdi_and_mps_folders_only_with_their_feature(
        values: dict[str, Any], written: set[str]) -> None:
    assert plugin_rights(values).written == PLUGIN_BASE | written


@pytest.mark.parametrize(("values", "hook"), [
    ({"deviceListStrategy": "cdi-cri"}, "/usr/bin/nvidia-ctk"),
    ({"deviceListStrategy": "cdi-cri", "cdi": {"nvidiaHookPath": HOOK}}, HOOK),
    ({"config": {"map": {"c": "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n"
                         "    nvidiaCTKPath: /opt/bin/nvidia-cdi-hook\n"}}}, "/opt/bin/nvidia-cdi-hook"),
])  # fmt: skip
def test_the_hook_binary_is_mounted_by_its_own_path(values: dict[str, Any], hook: str) -> None:
    dra = ({**values, "dra": {"enabled": True}}, f"{FULLNAME}-dra-plugin")
    for values_set, name in ((values, FULLNAME), dra):
        if name.endswith("dra-plugin") and "config" in values_set:
            continue  # an entry's device-list strategy means nothing to the DRA plugin
        daemonset = render(values_set).one("DaemonSet", name)
        spec = daemonset["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == "cdi-hook")
        assert volume["hostPath"] == {"path": hook, "type": "File"}
        plugin = spec["containers"][-1]
        mount = next(m for m in plugin["volumeMounts"] if m["name"] == "cdi-hook")
        # The plugin looks for the hook's base name in $NVDP_HOST_HOOK_DIR (nvdp.cdi.host.check_hook).
        assert mount == {"name": "cdi-hook", "mountPath": f"/host-cdi-hook/{hook.rsplit('/', 1)[1]}",
                         "readOnly": True}
        assert env(plugin)["NVDP_HOST_HOOK_DIR"] == "/host-cdi-hook"
        assert all(not v.get("hostPath", {}).get("path", "").endswith(("/bin", "/toolkit"))
                   for v in spec["volumes"])  # fmt: skip


def test_no_hook_is_mounted_when_every_entry_leaves_all_hooks_out() -> None:
    """A node without the hook binary would keep the pod from starting; with cdiDisableHooks [all] in
    every entry no spec names the hook, so nothing is mounted (nor checked)."""
    no_hooks = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n    cdiDisableHooks: [all]\n"
    dra = ({"dra": {"enabled": True}, "config": {"map": {"c": no_hooks}}}, f"{FULLNAME}-dra-plugin")
    for values, name in (({"config": {"map": {"c": no_hooks}}}, FULLNAME), dra):
        spec = render(values).one("DaemonSet", name)["spec"]["template"]["spec"]
        assert "cdi-hook" not in {v["name"] for v in spec["volumes"]}
        assert "NVDP_HOST_HOOK_DIR" not in env(spec["containers"][-1])
    # One entry that needs the hook is enough to mount it.
    hooks = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n"
    both = {"config": {"map": {"a": no_hooks, "b": hooks}, "default": "a"}}
    assert plugin_rights(both).read == {"/usr/bin/nvidia-ctk"}


def test_the_hook_check_finds_the_mounted_file(tmp_path: Path) -> None:
    """What the plugin does with the chart's env and mount: the file is found under its base name."""
    from msgspec.structs import replace

    from nvdp.cdi.facts import Roots
    from nvdp.cdi.host import check_hook
    from nvdp.config.model import Config

    values = {"deviceListStrategy": "cdi-cri", "cdi": {"nvidiaHookPath": HOOK}}
    plugin = container(render(values).one("DaemonSet", FULLNAME), "nvidia-device-plugin-ctr")
    mount = next(m for m in plugin["volumeMounts"] if m["name"] == "cdi-hook")
    mounted = tmp_path / mount["mountPath"].lstrip("/")
    mounted.parent.mkdir(parents=True)
    mounted.write_text("#!/bin/sh\n")
    mounted.chmod(0o755)
    config = Config()
    flags = replace(config.flags, plugin=replace(config.flags.plugin,
                                                 nvidia_ctk_path=env(plugin)["NVIDIA_CDI_HOOK_PATH"]))
    roots = Roots(driver_root="/", target_driver_root="/run/nvidia/driver", dev_root="/", target_dev_root="/")
    host_dir = str(tmp_path / str(env(plugin)["NVDP_HOST_HOOK_DIR"]).lstrip("/"))
    check_hook(replace(config, flags=flags), roots, {"NVDP_HOST_HOOK_DIR": host_dir})  # raises if not found


# --- the labeller on clusters without admission policies -------------------------------------------

@pytest.mark.parametrize("labeller", [{"enabled": True}, {"detectNodes": True}])
@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.29.9"])
def test_the_labeller_without_its_admission_policy_is_refused_unless_accepted(
        labeller: dict[str, Any], kube_version: str) -> None:
    error = render_error({"gfd": labeller}, kube_version=kube_version)
    assert f"Kubernetes {kube_version} does not have" in error
    assert "could change any Node's labels, taints or spec" in error
    assert "set 'gfd.allowWithoutAdmissionPolicy=true'" in error
    accepted = render({"gfd": {**labeller, "allowWithoutAdmissionPolicy": True}}, kube_version=kube_version)
    assert not accepted.find("ValidatingAdmissionPolicy")
    assert "accepted with\ngfd.allowWithoutAdmissionPolicy" in accepted.notes
    # From 1.30 the policy is installed and nothing needs accepting.
    fenced = render({"gfd": labeller}, kube_version="v1.30.0")
    assert fenced.find("ValidatingAdmissionPolicy") and "allowWithoutAdmissionPolicy" not in fenced.notes


def test_old_clusters_without_a_labeller_install_as_before() -> None:
    assert render({}, kube_version="v1.25.0").daemonsets()


# --- network --------------------------------------------------------------------------------------

def egress(rendered_: Rendered, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = rendered_.one("NetworkPolicy", name)["spec"]["egress"]
    return found


def test_api_server_egress_goes_to_the_given_addresses_only() -> None:
    values = {"dra": {"enabled": True}, "gfd": {"enabled": True}, "events": {"enabled": True},
              "networkPolicy": {"apiServerCIDRs": ["10.0.0.1/32", "192.168.10.0/29"],
                                "apiServerPorts": [6443]}}
    rendered_ = render(values)
    for name in ("dra-apiserver", "labeller-api"):
        assert egress(rendered_, f"{FULLNAME}-{name}") == [{
            "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "192.168.10.0/29"}}],
            "ports": [{"port": 6443, "protocol": "TCP"}]}]
    # Without addresses and without a cluster to look them up in (helm template): the ports, anywhere.
    for name in ("dra-apiserver", "labeller-api"):
        assert egress(render({**values, "networkPolicy": {}}), f"{FULLNAME}-{name}") == [
            {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}]


@pytest.mark.slow
def test_api_server_egress_is_looked_up_at_install(kube_api: Any) -> None:
    """`helm install` (a server-side dry run, which runs the lookups) against a real API server: egress
    only to the `kubernetes` Service's cluster IP and port, and to the API server's address and port in
    its EndpointSlice."""
    import json

    import helm_python
    import yaml
    from chart_helm import NAMESPACE, chart

    # The throwaway API server advertises 127.0.0.1, which it does not publish as its endpoint; the
    # EndpointSlice a real one keeps (as on the k8s kit's node: 10.88.0.1:6443).
    kube_api.apply(json.dumps({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "endpoints": [{"addresses": ["10.88.0.1"]}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}))
    config = helm_python.Config(kubeconfig_path=str(kube_api.admin_kubeconfig), namespace=NAMESPACE)
    try:
        release = config.install(chart(), "lp-lookup", {"gfd": {"enabled": True}}, namespace=NAMESPACE,
                                 dry_run="server")
    finally:
        config.close()
    policies = {o["metadata"]["name"]: o for o in yaml.safe_load_all(release["manifest"])
                if o and o["kind"] == "NetworkPolicy"}  # fmt: skip
    assert policies["lp-lookup-nvidia-device-plugin-labeller-api"]["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]},
        {"to": [{"ipBlock": {"cidr": "10.88.0.1/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]},
    ]


def test_api_server_cidrs_are_checked_by_the_schema() -> None:
    assert "apiServerCIDRs" in render_error({"networkPolicy": {"apiServerCIDRs": ["10.0.0.1"]}})


@pytest.mark.parametrize(("values", "selected"), [
    ({}, None),
    ({"events": {"enabled": True}}, ["device-plugin"]),
    ({"config": {"map": {"a": "version: v1\n", "b": MPS_ENTRY}, "default": "a"}},
     ["device-plugin", "mps-control-daemon"]),
    ({"config": {"map": {"a": "version: v1\n", "b": "version: v1\n"}, "default": "a"}}, ["device-plugin"]),
])  # fmt: skip
def test_only_pods_with_a_token_may_reach_the_api_server(values: dict[str, Any],
                                                         selected: list[str] | None) -> None:
    rendered_ = render(values)
    deny_all = rendered_.one("NetworkPolicy", f"{FULLNAME}-deny-all")["spec"]
    assert "egress" not in deny_all and "ingress" not in deny_all
    found = rendered_.find("NetworkPolicy", f"{FULLNAME}-allow-apiserver")
    if selected is None:
        assert not found
        return
    expression = found[0]["spec"]["podSelector"]["matchExpressions"]
    assert expression == [{"key": "app.kubernetes.io/component", "operator": "In", "values": selected}]


def test_the_dra_plugin_pod_is_isolated_without_the_device_plugin() -> None:
    rendered_ = render({"dra": {"enabled": True}, "devicePlugin": {"enabled": False}})
    deny_all = rendered_.one("NetworkPolicy", f"{FULLNAME}-deny-all")["spec"]
    assert deny_all["policyTypes"] == ["Ingress", "Egress"]
    assert deny_all["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "nvidia-device-plugin",
                                                      "app.kubernetes.io/instance": "nvdp"}
    dra = rendered_.one("DaemonSet", f"{FULLNAME}-dra-plugin")["spec"]["template"]["metadata"]["labels"]
    assert deny_all["podSelector"]["matchLabels"].items() <= dra.items()
    assert rendered_.one("NetworkPolicy", f"{FULLNAME}-dra-apiserver")["spec"]["policyTypes"] == ["Egress"]


def test_a_labeller_without_a_token_gets_no_egress() -> None:
    rendered_ = render({"gfd": {"enabled": True, "useNodeFeatureAPI": False}})
    gfd = rendered_.one("DaemonSet", f"{FULLNAME}-gpu-feature-discovery")["spec"]["template"]["spec"]
    assert gfd["automountServiceAccountToken"] is False
    assert not rendered_.find("NetworkPolicy", f"{FULLNAME}-labeller-api")


# --- requests and limits --------------------------------------------------------------------------

def resources_of(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for daemonset in render(values).find("DaemonSet"):
        spec = daemonset["spec"]["template"]["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            found[c["name"]] = c.get("resources") or {}
    return found


def test_every_container_has_requests_and_the_measured_defaults() -> None:
    values = {"config": {"map": {"c": MPS_ENTRY}}, "gfd": {"enabled": True, "detectNodes": True},
              "dra": {"enabled": True, "defaultMode": "device-plugin"}}
    found = resources_of(values)
    assert set(found) == {"nvidia-device-plugin-ctr", "mps-control-daemon-mounts", "mps-control-daemon-ctr",
                          "gpu-feature-discovery-ctr", "gpu-presence", "dra-mps-mount-shm", "dra-mps-ctr",
                          "nvidia-dra-plugin-ctr"}
    for name, resources in found.items():
        assert {"cpu", "memory"} <= set(resources["requests"]), name
        assert "cpu" not in resources.get("limits", {}), f"{name}: no CPU limit (throttling)"
    # Memory limited at the request where no NVIDIA process runs in the container.
    for name in ("nvidia-device-plugin-ctr", "gpu-feature-discovery-ctr"):
        assert found[name]["limits"]["memory"] == found[name]["requests"]["memory"], name
    # The MPS control daemons (and their MPS servers) run in these: no memory limit by default.
    for name in ("mps-control-daemon-ctr", "dra-mps-ctr"):
        assert "limits" not in found[name], name


def test_nvidias_resources_key_still_applies_to_every_container() -> None:
    mine = {"requests": {"cpu": "50m", "memory": "200Mi"}, "limits": {"memory": "400Mi"}}
    found = resources_of({"resources": mine, "config": {"map": {"c": MPS_ENTRY}}, "gfd": {"enabled": True}})
    assert {name: r for name, r in found.items()} == dict.fromkeys(found, mine)
    # and a daemon's own value replaces its default
    own = {"requests": {"cpu": "1", "memory": "1Gi"}}
    assert resources_of({"devicePlugin": {"resources": own}})["nvidia-device-plugin-ctr"]["requests"] == own[
        "requests"]


# --- the README's table ---------------------------------------------------------------------------

README = CHART_DIR / "README.md"
TABLE_HEADER = ("| configuration | pod | privileges | host paths written | host paths read | token "
                "| API rules |")


def readme_table() -> dict[str, dict[str, Rights]]:
    """The README's "Rights by configuration" table, parsed."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index(TABLE_HEADER) + 2
    table: dict[str, dict[str, Rights]] = {}
    configuration = ""
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        configuration = cells[0].strip("*") or configuration
        pod, privileges, written, read, token, api = cells[1:]
        privileged: set[str] = set()
        capabilities: set[str] = set()
        host: set[str] = set()
        for item in split(privileges, ";"):
            if item.startswith("privileged:"):
                privileged.update(split(item.removeprefix("privileged:"), ","))
            elif item.startswith("host "):
                host.add(item)
            else:
                capabilities.add(item)
        api_rules: set[str] = set()
        for item in split(api, ";"):
            resource, verbs = item.split(":", 1) if ":" in item else (item, "")
            api_rules.update(f"{resource.strip()}: {verb.strip()}" for verb in split(verbs, ","))
        table.setdefault(configuration, {})[pod] = Rights(
            frozenset(privileged), frozenset(capabilities), frozenset(host), frozenset(split(written, ",")),
            frozenset(split(read, ",")), token == "yes", frozenset(api_rules))
    return table


def split(cell: str, separator: str) -> list[str]:
    """A cell's items: `code` marks dropped, "-" for none."""
    items = [re.sub(r"`", "", item).strip() for item in cell.split(separator)]
    return [item for item in items if item and item != "-"]


def test_the_readme_table_names_every_configuration_tested() -> None:
    assert list(readme_table()) == list(SETS)


@pytest.mark.parametrize("name", list(SETS))
def test_the_readme_table_agrees_with_what_renders(name: str) -> None:
    assert readme_table()[name] == rights(name)
