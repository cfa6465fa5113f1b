"""What the chart renders for each option: rights, MPS gating, config selection, names, notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_helm import NAMESPACE, Manifest, container, env, render, values_file

DATA = Path(__file__).parent / "data"
PLUGIN = "nvdp-nvidia-device-plugin"
MPS = "nvdp-nvidia-device-plugin-mps-control-daemon"
MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
TS_CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
DROP_ALL = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
SYS_ADMIN = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
}


def plugin_ctr(values: dict[str, Any]) -> Manifest:
    return container(render(values).one("DaemonSet", PLUGIN), "nvidia-device-plugin-ctr")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, DROP_ALL),
        ({"migStrategy": "none"}, DROP_ALL),
        ({"migStrategy": "single"}, SYS_ADMIN),
        ({"migStrategy": "mixed"}, SYS_ADMIN),
        ({"deviceListStrategy": "volume-mounts"}, SYS_ADMIN),
        ({"deviceListStrategy": ["envvar", "volume-mounts"]}, SYS_ADMIN),
        ({"deviceListStrategy": "cdi-cri"}, DROP_ALL),
        ({"config": {"map": {"c": TS_CONFIG}}}, DROP_ALL),
        ({"config": {"map": {"c": "flags:\n  migStrategy: mixed\n"}}}, SYS_ADMIN),
        (
            {"config": {"map": {"c": {"flags": {"plugin": {"deviceListStrategy": ["volume-mounts"]}}}}}},
            SYS_ADMIN,
        ),
        # The env var overrides the file, so the file's MIG strategy never applies.
        ({"migStrategy": "none", "config": {"map": {"c": "flags:\n  migStrategy: mixed\n"}}}, DROP_ALL),
        # An existing ConfigMap cannot be read: assume it may use MIG.
        ({"config": {"name": "mine", "default": "c"}}, SYS_ADMIN),
        ({"compatWithCPUManager": True}, {"privileged": True}),
        ({"compatWithCPUManager": False}, DROP_ALL),
        ({"compatWithCPUManager": True, "securityContext": {"runAsUser": 0}}, {"runAsUser": 0}),
    ],
)
def test_plugin_gets_extra_rights_only_for_features_that_need_them(
    values: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert plugin_ctr(values)["securityContext"] == expected


def test_mig_monitoring_env_only_when_mig_is_possible() -> None:
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in env(plugin_ctr({}))
    assert env(plugin_ctr({"migStrategy": "mixed"}))["NVIDIA_MIG_MONITOR_DEVICES"] == "all"


def test_null_values_leave_binary_defaults_and_typed_values_are_passed() -> None:
    assert set(env(plugin_ctr({}))) == {
        "NODE_NAME",
        "MPS_ROOT",
        "DEVICE_PLUGIN_PATH",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "HEALTH_ADDRESS",  # probes are on by default; metrics are not
        # devicePlugin.healthRecovery has values of its own (not NVIDIA's: its plugin has no recovery)
        "HEALTH_RECOVERY_AFTER",
        "HEALTH_FLAP_LIMIT",
        "HEALTH_STATE_DIR",
    }
    variables = env(
        plugin_ctr(
            {
                "failOnInitError": False,
                "compatWithCPUManager": False,
                "deviceListStrategy": ["envvar", "cdi-annotations"],
            }
        )
    )
    assert variables["FAIL_ON_INIT_ERROR"] == "false"
    assert variables["PASS_DEVICE_SPECS"] == "false"
    assert variables["DEVICE_LIST_STRATEGY"] == "envvar,cdi-annotations"


@pytest.mark.parametrize(
    ("values", "rendered"),
    [
        ({}, False),
        ({"config": {"map": {"c": TS_CONFIG}}}, False),
        ({"config": {"map": {"c": MPS_CONFIG}}}, True),
        ({"config": {"map": {"ts": TS_CONFIG, "mps": MPS_CONFIG}, "default": "ts"}}, True),
        (
            {
                "config": {
                    "map": {
                        "c": {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
                    }
                }
            },
            True,
        ),
        ({"config": {"map": {"c": MPS_CONFIG}}, "mps": {"enabled": False}}, False),
        ({"config": {"name": "mine", "default": "c"}}, False),
        ({"config": {"name": "mine", "default": "c"}, "mps": {"enabled": True}}, True),
        ({"config": {"map": {"c": MPS_CONFIG}}, "devicePlugin": {"enabled": False}}, False),
    ],
)
def test_mps_daemon_rendered_when_a_config_uses_mps_or_forced(values: dict[str, Any], rendered: bool) -> None:
    assert (MPS in render(values).daemonsets()) is rendered


def test_mps_node_selector_merges_users_and_keeps_the_mps_label() -> None:
    values = {
        "config": {"map": {"c": MPS_CONFIG}},
        "nodeSelector": {"gpu": "yes", "nvidia.com/mps.capable": "no"},
    }
    spec = render(values).one("DaemonSet", MPS)["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "yes", "nvidia.com/mps.capable": "true"}


def test_mps_without_host_pid_shares_the_process_namespace() -> None:
    values = {"config": {"map": {"c": MPS_CONFIG}}, "mps": {"enableHostPID": False}}
    spec = render(values).one("DaemonSet", MPS)["spec"]["template"]["spec"]
    assert "hostPID" not in spec
    assert spec["shareProcessNamespace"] is True


def test_mps_shared_memory_follows_remounts_on_the_host() -> None:
    """The daemon's init container mounts a new tmpfs at <mps.root>/shm on each start; the plugin
    and the daemon must see that one, not the one (or the bare directory) they started with."""
    rendered = render({"config": {"map": {"c": MPS_CONFIG}}})
    daemon = rendered.one("DaemonSet", MPS)["spec"]["template"]["spec"]
    mounts = {
        "plugin": container(rendered.one("DaemonSet", PLUGIN), "nvidia-device-plugin-ctr")["volumeMounts"],
        "daemon": container(rendered.one("DaemonSet", MPS), "mps-control-daemon-ctr")["volumeMounts"],
        "init": daemon["initContainers"][0]["volumeMounts"],
    }
    propagation = {
        (who, m["mountPath"]): m.get("mountPropagation")
        for who, listed in mounts.items()
        for m in listed
        if m["name"] in ("mps-root", "mps-shm")
    }
    assert propagation == {
        ("plugin", "/mps"): "HostToContainer",
        ("plugin", "/dev/shm"): "HostToContainer",
        ("daemon", "/mps"): "HostToContainer",
        ("daemon", "/dev/shm"): "HostToContainer",
        # hostPID (the default): the init container mounts in the host's mount namespace instead.
        ("init", "/mps"): None,
    }
    # Mounting in the host's namespace (or, without hostPID, Bidirectional propagation) needs privilege.
    assert daemon["initContainers"][0]["securityContext"] == {"privileged": True}
    no_host_pid = render({"config": {"map": {"c": MPS_CONFIG}}, "mps": {"enableHostPID": False}})
    init = no_host_pid.one("DaemonSet", MPS)["spec"]["template"]["spec"]["initContainers"][0]
    propagated = {m["mountPath"]: m.get("mountPropagation") for m in init["volumeMounts"]}
    assert propagated["/mps"] == "Bidirectional"


@pytest.mark.parametrize(
    ("config", "entries", "key"),
    [
        ({"map": {"only": TS_CONFIG}}, None, "only"),
        ({"map": {"only": TS_CONFIG}, "fallbackStrategies": ["named"], "default": "only"}, None, "only"),
        ({"map": {"only": TS_CONFIG}, "fallbackStrategies": ["empty"]}, None, None),
        ({"map": {"a": TS_CONFIG, "default": TS_CONFIG}}, None, "default"),
        ({"map": {"a": TS_CONFIG, "b": TS_CONFIG}, "default": "b"}, None, "b"),
        ({"map": {"a": TS_CONFIG, "b": TS_CONFIG}, "fallbackStrategies": ["named", "empty"]}, None, None),
        ({"name": "mine"}, ("default", "gpu"), "default"),
        ({"name": "mine", "default": "gpu"}, ("default", "gpu"), "gpu"),
    ],
)
def test_any_config_is_chosen_per_node_by_the_daemons(
    config: dict[str, Any], entries: tuple[str, ...] | None, key: str | None
) -> None:
    """The whole ConfigMap is mounted with what the daemons choose by; the chart chooses nothing.

    An unlabelled node gets what the daemons' own rule (nvdp.config.select) makes of the rendered env.
    """
    from nvdp.config.select import parse_fallbacks, select_entry

    rendered = render({"config": config})
    for name, ctr in ((PLUGIN, "nvidia-device-plugin-ctr"), (MPS, "mps-control-daemon-ctr")):
        if name == MPS and not rendered.find("DaemonSet", MPS):
            continue
        ds = rendered.one("DaemonSet", name)
        spec = ds["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        variables = env(container(ds, ctr))
        assert volumes["available-configs"]["configMap"] == {"name": config.get("name", f"{PLUGIN}-configs")}
        assert "config" not in volumes and "CONFIG_FILE" not in variables
        assert variables["CONFIG_DIR"] == "/available-configs"
        fallbacks = config.get("fallbackStrategies", ["named", "single"])
        assert variables["FALLBACK_STRATEGIES"] == ",".join(fallbacks)
        # The node label watched (token mounted) only where it can change the entry: not with one
        # entry that unlabelled nodes get anyway.
        assert spec["automountServiceAccountToken"] is ("name" in config or len(config["map"]) > 1
                                                        or key is None)
        assert "checksum/config" not in ds["spec"]["template"]["metadata"].get("annotations", {})
        names = entries or tuple(config["map"])
        chosen = select_entry(names, None, variables.get("DEFAULT_CONFIG"),
                              parse_fallbacks(variables["FALLBACK_STRATEGIES"]))
        assert chosen.entry == key


def test_inline_object_entries_are_rendered_as_yaml() -> None:
    entry = {"version": "v1", "flags": {"migStrategy": "single"}}
    cm = render({"config": {"map": {"c": entry}}}).one("ConfigMap")
    assert cm["data"] == {"c": "flags:\n  migStrategy: single\nversion: v1\n"}


def test_driver_root_mounted_read_only_only_when_set() -> None:
    assert "driver-root" not in {m["name"] for m in plugin_ctr({})["volumeMounts"]}
    ctr = plugin_ctr({"nvidiaDriverRoot": "/run/nvidia/driver"})
    assert {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True} in ctr["volumeMounts"]
    assert env(ctr)["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"


def test_images_default_to_app_version_and_are_independent() -> None:
    values = {
        "config": {"map": {"c": MPS_CONFIG}},
        "image": {"repository": "nvcr.io/nvidia/k8s-device-plugin"},
    }
    ds = render(values).daemonsets()
    assert (
        container(ds[PLUGIN], "nvidia-device-plugin-ctr")["image"] == "nvcr.io/nvidia/k8s-device-plugin:0.1.0"
    )
    assert (
        container(ds[MPS], "mps-control-daemon-ctr")["image"] == "ghcr.io/nvdp-project/nvdp-mps-daemon:0.1.0"
    )
    values["mpsImage"] = {"repository": "example.com/mps", "tag": "v9", "pullPolicy": "Always"}
    mps = container(render(values).one("DaemonSet", MPS), "mps-control-daemon-ctr")
    assert (mps["image"], mps["imagePullPolicy"]) == ("example.com/mps:v9", "Always")


def test_notes_tell_how_to_switch_a_node_with_per_node_config() -> None:
    notes = render({"config": {"map": {"ts": TS_CONFIG, "mps": MPS_CONFIG}, "default": "ts"}}).notes
    assert "(entries: mps, ts); unlabelled nodes run\nentry \"ts\" (config.default)" in notes
    assert "kubectl label node <node> nvidia.com/device-plugin.config=<entry> --overwrite" in notes
    one = render({"config": {"map": {"ts": TS_CONFIG}}}).notes
    assert "unlabelled nodes run\nwhat config.fallbackStrategies give (named, single)" in one
    assert "nvidia.com/device-plugin.config" not in render({}).notes


def test_no_api_access_is_granted_without_a_config_and_events() -> None:
    rendered = render({"events": {"enabled": False}})
    kinds = {o["kind"] for o in rendered.objects}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    assert rendered.one("ServiceAccount")["automountServiceAccountToken"] is False
    for ds in rendered.find("DaemonSet"):
        assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "egress" not in rendered.one("NetworkPolicy")["spec"]


@pytest.mark.parametrize("config", [{"map": {"ts": TS_CONFIG, "mps": MPS_CONFIG}, "default": "ts"},
                                    {"name": "mine", "default": "gpu"}])
def test_per_node_config_grants_node_reads_and_event_writes_only(config: dict[str, Any]) -> None:
    rendered = render({"config": config})
    (role,) = rendered.find("ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    (binding,) = rendered.find("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = {"kind": "ServiceAccount", "namespace": NAMESPACE,
               "name": rendered.one("ServiceAccount")["metadata"]["name"]}
    assert binding["subjects"] == [account]
    # Node Events: create only, in the default namespace, where they live.
    (events,) = rendered.find("Role")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    (events_binding,) = rendered.find("RoleBinding")
    assert events_binding["subjects"] == [account]
    # Egress to the API server for the pods that hold a token (the deny-all policy opens nothing).
    assert "egress" not in rendered.one("NetworkPolicy", "nvdp-nvidia-device-plugin-deny-all")["spec"]
    allow = rendered.one("NetworkPolicy", "nvdp-nvidia-device-plugin-allow-apiserver")["spec"]
    ports = allow["egress"][0]["ports"]
    assert {p["port"] for p in ports} == {443, 6443}


def test_events_grant_only_creating_events_to_the_plugin() -> None:
    rendered = render({"mps": {"enabled": True}, "events": {"enabled": True}})
    # A Role in the namespace Node events are written in (default), not a ClusterRole.
    assert not rendered.find("ClusterRole") and not rendered.find("ClusterRoleBinding")
    (role,) = rendered.find("Role")
    assert role["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    (binding,) = rendered.find("RoleBinding")
    assert binding["metadata"]["namespace"] == "default"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    account = rendered.one("ServiceAccount")["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": "nvidia-device-plugin"}
    assert binding["subjects"] == [subject]
    automount = {ds["metadata"]["name"]: ds["spec"]["template"]["spec"]["automountServiceAccountToken"]
                 for ds in rendered.find("DaemonSet")}
    assert automount == {
        "nvdp-nvidia-device-plugin": True,
        "nvdp-nvidia-device-plugin-mps-control-daemon": False,
    }
    # The deny-all policy also denies egress: the API server's ports are opened for the plugin.
    egress = rendered.one("NetworkPolicy", "nvdp-nvidia-device-plugin-allow-apiserver")["spec"]
    assert egress["policyTypes"] == ["Egress"]
    ports = [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]
    assert egress["egress"] == [{"ports": ports}]


def test_helm_test_pod_requests_one_gpu_and_runs_nvidia_smi() -> None:
    pod = render({}).one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (ctr,) = pod["spec"]["containers"]
    assert ctr["command"] == ["nvidia-smi", "-L"]
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_nvidia_format_values_file_renders_with_gpu_feature_discovery() -> None:
    rendered = render(values_file(DATA / "nvidia-format-values.yaml"))
    gfd = f"{PLUGIN}-gpu-feature-discovery"
    assert sorted(rendered.daemonsets()) == [PLUGIN, gfd]
    assert container(rendered.one("DaemonSet", PLUGIN), "nvidia-device-plugin-ctr")["image"] == (
        "nvcr.io/nvidia/k8s-device-plugin:0.1.0"
    )
    # NVIDIA's gfd.securityContext (privileged) is honoured as given.
    assert container(rendered.one("DaemonSet", gfd), "gpu-feature-discovery-ctr")["securityContext"] == {
        "privileged": True
    }
    assert "gfd.enabled" not in rendered.notes
    assert "kubectl get nodes -L nvidia.com/gpu.product" in rendered.notes


def test_notes_quiet_about_ignored_keys_by_default() -> None:
    assert "ignored" not in render({}).notes


def test_kubelet_root_dir_moves_the_socket_dir() -> None:
    ctr = plugin_ctr({"devicePlugin": {"kubeletRootDir": "/var/snap/microk8s/common/var/lib/kubelet/"}})
    assert env(ctr)["DEVICE_PLUGIN_PATH"] == "/var/snap/microk8s/common/var/lib/kubelet/device-plugins"
