"""The chart's DRA mode: the DRA kubelet plugin DaemonSet, its RBAC, admission policy, DeviceClasses
and network policy; never together with the device-plugin DaemonSet; the driver name checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_helm import NAMESPACE, Manifest, container, env, render, render_error
from test_render import ALL_VERSIONS, assert_valid

DRA = {"dra": {"enabled": True}}
DRA_OBJECTS = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
               "ValidatingAdmissionPolicyBinding", "DeviceClass"}  # fmt: skip
DAEMONSET = "nvdp-nvidia-device-plugin-dra-plugin"
PLUGIN_DAEMONSET = "nvdp-nvidia-device-plugin"
CTR = "nvidia-dra-plugin-ctr"
B_ENTRY = "version: v1\nflags:\n  failOnInitError: false\n"
TWO_ENTRIES = {"config": {"map": {"a": "version: v1\n", "b": B_ENTRY}, "default": "a"}}
# resource.k8s.io/v1 is served from Kubernetes 1.34.
DRA_VERSIONS = [v for v in ALL_VERSIONS if int(v.split(".")[1]) >= 34]


def dra_render(values: dict[str, Any] | None = None) -> list[Manifest]:
    from chart_helm import merge_values

    return render(merge_values(DRA, values or {})).objects


def names(objects: list[Manifest], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["kind"] == kind}


def test_default_render_has_no_dra_objects() -> None:
    objects = render().objects
    assert names(objects, "DaemonSet") >= {PLUGIN_DAEMONSET}
    assert DAEMONSET not in names(objects, "DaemonSet")
    assert not any(o["kind"] == "DeviceClass" or "dra" in o["metadata"]["name"] for o in objects)


@pytest.mark.parametrize("values", [{}, TWO_ENTRIES, {"nvidiaDriverRoot": "/run/nvidia/driver",
                                                      "metrics": {"enabled": True}}],
                         ids=["defaults", "per-node-config", "driver-root-metrics"])
def test_dra_renders_its_objects_and_no_device_plugin(values: dict[str, Any]) -> None:
    objects = dra_render(values)
    assert names(objects, "DaemonSet") == {DAEMONSET, "nvdp-nvidia-device-plugin-dra-mps"}
    assert {o["kind"] for o in objects} >= DRA_OBJECTS
    assert names(objects, "DeviceClass") == {"gpu.nvidia.com", "mig.nvidia.com", "nvidia.com-gpu"}
    assert_valid(objects, DRA_VERSIONS)


def daemonset(values: dict[str, Any] | None = None) -> Manifest:
    (ds,) = [o for o in dra_render(values) if o["kind"] == "DaemonSet" and o["metadata"]["name"] == DAEMONSET]
    return ds


def test_the_daemonset_runs_the_dra_plugin_with_the_kubelet_folders() -> None:
    ds = daemonset()
    pod = ds["spec"]["template"]["spec"]
    ctr = container(ds, CTR)
    assert ctr["command"] == ["nvidia-dra-plugin"]
    assert pod["serviceAccountName"] == DAEMONSET and pod["automountServiceAccountToken"] is True
    variables = env(ctr)
    assert variables["NODE_NAME"] is None  # from the pod's spec.nodeName
    assert variables["DRA_DRIVER_NAME"] == "gpu.nvidia.com"
    assert variables["KUBELET_PLUGINS_DIR"] == "/var/lib/kubelet/plugins"
    assert variables["KUBELET_REGISTRAR_DIR"] == "/var/lib/kubelet/plugins_registry"
    assert variables["CDI_ROOT"] == "/var/run/cdi"
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    assert mounts["plugin-dir"] == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    assert mounts["registrar-dir"] == "/var/lib/kubelet/plugins_registry"
    assert mounts["cdi-root"] == "/var/run/cdi"
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert volumes["plugin-dir"] == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    assert ctr["securityContext"] == {"privileged": True}
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Scheduling as the device plugin's: same affinity, tolerations and priority.
    plugin = render().daemonsets()[PLUGIN_DAEMONSET]["spec"]["template"]["spec"]
    for key in ("affinity", "tolerations", "priorityClassName", "securityContext"):
        assert pod[key] == plugin[key], key


def test_the_device_plugins_config_driver_and_cdi_settings_reach_the_dra_plugin() -> None:
    values = {**TWO_ENTRIES, "nvidiaDriverRoot": "/run/nvidia/driver", "nvidiaDevRoot": "/",
              "cdi": {"nvidiaHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
                      "featureFlags": ["a", "b"]},
              "gdsEnabled": True, "failOnInitError": False, "disableHealthChecks": "xids"}  # fmt: skip
    ds = daemonset(values)
    variables = env(container(ds, CTR))
    # The device plugin mounts the hook only with a CDI strategy.
    plugin_values = {**values, "deviceListStrategy": "cdi-cri"}
    plugin = render(plugin_values).daemonsets()[PLUGIN_DAEMONSET]
    plugin_env = env(container(plugin, "nvidia-device-plugin-ctr"))
    for name in ("CONFIG_DIR", "DEFAULT_CONFIG", "FALLBACK_STRATEGIES", "NVIDIA_DRIVER_ROOT",
                 "NVIDIA_DEV_ROOT", "NVIDIA_CDI_HOOK_PATH", "CDI_FEATURE_FLAGS", "NVDP_HOST_HOOK_DIR",
                 "GDS_ENABLED",
                 "FAIL_ON_INIT_ERROR", "DP_DISABLE_HEALTHCHECKS", "NVIDIA_VISIBLE_DEVICES",
                 "NVIDIA_DRIVER_CAPABILITIES", "HEALTH_ADDRESS"):  # fmt: skip
        assert variables[name] == plugin_env[name], name
    pod = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(ds, CTR)["volumeMounts"]}
    assert mounts["available-configs"]["mountPath"] == "/available-configs"
    assert mounts["driver-root"]["mountPath"] == "/driver-root" and mounts["driver-root"]["readOnly"]
    assert mounts["cdi-hook"]["mountPath"] == "/host-cdi-hook/nvidia-cdi-hook"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == "nvdp-nvidia-device-plugin-configs"
    assert volumes["cdi-hook"]["hostPath"] == {"path": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
                                               "type": "File"}
    # Device-plugin-only settings stay out.
    for name in ("DEVICE_PLUGIN_PATH", "DEVICE_LIST_STRATEGY", "PASS_DEVICE_SPECS"):
        assert name not in variables


def test_custom_folders_and_driver_name_follow_through() -> None:
    values = {"dra": {"driverName": "gpu.example.com", "kubeletPluginsDir": "/data/kubelet/plugins/",
                      "kubeletRegistrarDir": "/data/kubelet/plugins_registry"}}  # fmt: skip
    objects = dra_render(values)
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == DAEMONSET]
    variables = env(container(ds, CTR))
    assert variables["DRA_DRIVER_NAME"] == "gpu.example.com"
    (mps,) = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] != DAEMONSET]
    assert container(mps, "dra-mps-ctr")["command"][-1] == "gpu.example.com"
    assert variables["KUBELET_PLUGINS_DIR"] == "/data/kubelet/plugins"
    mounts = {m["name"]: m["mountPath"] for m in container(ds, CTR)["volumeMounts"]}
    assert mounts["plugin-dir"] == "/data/kubelet/plugins/gpu.example.com"
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.example.com", "mig.example.com", "nvidia.com-gpu"}
    assert classes["gpu.example.com"]["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].type == 'gpu'")
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                 and not o["metadata"]["name"].endswith("-claim-status")]
    assert "gpu.example.com" in policy["spec"]["validations"][2]["expression"]
    assert not names(dra_render({"dra": {"deviceClasses": False}}), "DeviceClass")


def test_rbac_and_policy_name_the_dra_account() -> None:
    objects = dra_render()
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and "dra" in o["metadata"]["name"]]
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
             for r in rule["resources"]}  # fmt: skip
    # Claims' status (this driver's entries, the admission policy), no pods (the kubelet's pod-resources
    # API says which pods use the GPUs): test_dra_rbac.py.
    assert rules == {
        ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch"},
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
        ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:patch"},
        ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
        ("", "nodes"): {"get", "list", "watch"},
        ("", "events"): {"create"},  # on its Node, and on claims in their namespaces
    }
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding" and "dra" in o["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": DAEMONSET, "namespace": NAMESPACE}]
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                 and not o["metadata"]["name"].endswith("-claim-status")]
    (condition,) = policy["spec"]["matchConditions"]
    user = f"system:serviceaccount:{NAMESPACE}:{DAEMONSET}"
    assert condition["expression"] == f'request.userInfo.username == "{user}"'
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["resourceslices"]
    (policy_binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                         and o["spec"]["policyName"] == policy["metadata"]["name"]]
    assert policy_binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_dra_plugin_may_reach_the_api_server_through_the_network_policies() -> None:
    objects = dra_render()
    (allow,) = [o for o in objects if o["kind"] == "NetworkPolicy" and "dra" in o["metadata"]["name"]]
    assert allow["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "dra-plugin"
    assert {p["port"] for p in allow["spec"]["egress"][0]["ports"]} == {443, 6443}
    assert not [o for o in dra_render({"networkPolicy": {"enabled": False}}) if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(("driver", "message"), [
    ("gpu.a-very-long-example.com",
     "'dra.driverName' is \"gpu.a-very-long-example.com\" (27 characters), but a DRA driver name may have "
     "at most 26"),
    ("GPU.example.com", "'dra.driverName' is \"GPU.example.com\", which is not a DNS subdomain"),
    ("gpu_example.com", "which is not a DNS subdomain"),
    ("gpu.example.com.", "which is not a DNS subdomain"),
])  # fmt: skip
def test_a_bad_driver_name_is_refused_naming_the_value_and_the_fix(driver: str, message: str) -> None:
    error = render_error({"dra": {"enabled": True, "driverName": driver}})
    assert message in error
    assert "Set 'dra.driverName' to" in error
    # A name of exactly 26 characters is fine.
    assert dra_render({"dra": {"driverName": "gpu.abcdefghij.example.com"}})


@pytest.mark.parametrize("kube_version", ["v1.34.0", "v1.36.0"])
def test_lint_strict_clean_with_dra(kube_version: str) -> None:
    import helm_python
    from chart_helm import CHART_DIR

    report = helm_python.lint(str(CHART_DIR), {**DRA, **TWO_ENTRIES}, strict=True, namespace=NAMESPACE,
                              kube_version=kube_version)  # fmt: skip
    problems = [m for m in report["messages"] if m["error"] != "icon is recommended"]
    assert not problems and not report["errors"], (problems, report["errors"])


def test_dra_needs_kubernetes_1_34(capfd: pytest.CaptureFixture[str]) -> None:
    # Only `helm lint` takes a Kubernetes version here; it reports a template's `fail` in its log.
    import helm_python
    from chart_helm import CHART_DIR

    helm_python.lint(str(CHART_DIR), DRA, strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    text = capfd.readouterr().err
    assert ("'dra.enabled' needs Kubernetes 1.34 or later (resource.k8s.io/v1), "
            "but the cluster runs v1.33.0") in text
    assert "set 'dra.enabled=false'" in text


@pytest.mark.slow
def test_checkov_finds_only_what_is_accepted_for_the_device_plugin(tmp_path: Path) -> None:
    # The DRA DaemonSet counts as the device plugin's component (its name starts like it): it needs
    # no right the device plugin's documented findings do not already cover.
    import json
    import os
    import subprocess

    import yaml
    from test_checkov import ACCEPTED, checkov, component

    renders = {"dra": {}, "dra-config-metrics": {**TWO_ENTRIES, "metrics": {"enabled": True}}}
    for name, values in renders.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(dra_render(values)), encoding="utf-8")
    done = subprocess.run(
        [str(checkov()), "-d", str(tmp_path), "--framework", "kubernetes", "--quiet", "--compact",
         "--skip-download", "-o", "json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )  # fmt: skip
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    assert reports[0]["summary"]["parsing_errors"] == 0
    failed = {(c["check_id"], component(c["resource"]), c["resource"])
              for r in reports for c in r["results"]["failed_checks"]}  # fmt: skip
    assert any(DAEMONSET in resource for _, _, resource in failed)  # the DRA DaemonSet was checked
    # No host PID any more: the MPS daemons of DRA claims run in the dra-mps DaemonSet.
    assert ("CKV_K8S_17", "device-plugin", f"DaemonSet.{NAMESPACE}.{DAEMONSET}") not in failed
    # No memory limit by default (values.yaml, dra.resources).
    failed.discard(("CKV_K8S_13", "device-plugin", f"DaemonSet.{NAMESPACE}.{DAEMONSET}"))
    unexplained = sorted(f for f in failed if f[1] not in ACCEPTED.get(f[0], set()))
    assert not unexplained, unexplained


def test_helm_test_asks_for_the_gpu_through_a_claim_in_dra_mode() -> None:
    objects = dra_render()
    (template,) = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
    (pod,) = [o for o in objects if o["kind"] == "Pod"]
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert template["metadata"]["annotations"]["helm.sh/hook-weight"] == "-1", "made before the pod"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu",
                                              "resourceClaimTemplateName": template["metadata"]["name"]}]
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpu"}]
    assert "nvidia.com/gpu" not in resources["limits"], "no device-plugin resource on a DRA node"
    plain = [o for o in render().objects if o["kind"] == "Pod"]
    assert plain and plain[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


MPS_ROOT = "/run/nvidia/mps"
DRA_MPS = "nvdp-nvidia-device-plugin-dra-mps"
MPS_CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"


def dra_mps(values: dict[str, Any] | None = None) -> Manifest:
    (ds,) = [o for o in dra_render(values) if o["kind"] == "DaemonSet" and o["metadata"]["name"] == DRA_MPS]
    return ds


def test_the_dra_plugin_orders_mps_daemons_in_its_driver_folder_only() -> None:
    """The plugin writes orders (nvdp.mps.ordered); it runs no MPS process: no host PID, no shared
    process namespace, no privileged init container, and only <mps.root>/<driver> mounted."""
    ds = daemonset()
    pod, ctr = ds["spec"]["template"]["spec"], container(ds, CTR)
    assert "hostPID" not in pod and "shareProcessNamespace" not in pod and "initContainers" not in pod
    variables = env(ctr)
    assert variables["MPS_ROOT"] == MPS_ROOT
    assert variables["NVDP_DRA_MPS_DAEMONSET"] == f"DaemonSet {DRA_MPS}"
    assert "MPS_MOUNT_IN_HOST_NAMESPACE" not in variables
    mounts = [m for m in ctr["volumeMounts"] if m["name"].startswith("mps")]
    assert mounts == [{"name": "mps-dir", "mountPath": "/mps/gpu.nvidia.com"}]
    volumes = [v for v in pod["volumes"] if v["name"].startswith("mps")]
    assert volumes == [{"name": "mps-dir", "hostPath": {"path": f"{MPS_ROOT}/gpu.nvidia.com",
                                                        "type": "DirectoryOrCreate"}}]


def test_the_dra_mps_daemonset_runs_the_orders_as_the_mps_daemon_runs_its_own() -> None:
    # The MPS control-daemon DaemonSet (device-plugin mode, a config that uses MPS) is the model.
    for host_pid in (True, False):
        values = {"mps": {"root": "/var/run/mps/", "enableHostPID": host_pid}}
        ds = dra_mps(values)
        plugin = daemonset(values)
        rendered = render({**values, "config": {"map": {"c": MPS_CONFIG}}})
        daemon = rendered.daemonsets()["nvdp-nvidia-device-plugin-mps-control-daemon"]
        ours, theirs = ds["spec"]["template"]["spec"], daemon["spec"]["template"]["spec"]
        for key in ("hostPID", "shareProcessNamespace"):
            assert ours.get(key) == theirs.get(key), key
        # On the DRA plugin's nodes, with no token.
        for key in ("affinity", "tolerations", "priorityClassName", "nodeSelector"):
            assert ours.get(key) == plugin["spec"]["template"]["spec"].get(key), key
        assert ours["automountServiceAccountToken"] is False
        (init,) = ours["initContainers"]
        (model,) = theirs["initContainers"]
        for key in ("command", "securityContext", "image", "imagePullPolicy"):
            assert init[key] == model[key], key
        # the same settings, on the driver's own folder: <root>/<driver>, where its tmpfs goes
        assert env(init) == {**env(model), "MPS_ROOT": "/var/run/mps/gpu.nvidia.com",
                             "MPS_CONTAINER_ROOT": "/mps/gpu.nvidia.com"}
        propagation = {} if host_pid else {"mountPropagation": "Bidirectional"}
        assert init["volumeMounts"] == [{"name": "dra-mps-dir", "mountPath": "/mps/gpu.nvidia.com",
                                         **propagation}]
        ctr = container(ds, "dra-mps-ctr")
        model_ctr = container(daemon, "mps-control-daemon-ctr")
        assert ctr["command"] == ["mps-control-daemon", "--dra-driver", "gpu.nvidia.com"]
        assert ctr["image"] == model_ctr["image"] and ctr["securityContext"] == {"privileged": True}
        assert env(ctr)["MPS_ROOT"] == env(model_ctr)["MPS_ROOT"] == "/var/run/mps/"
        assert env(ctr)["MPS_MOUNT_IN_HOST_NAMESPACE"] == str(host_pid).lower()
        assert ctr["volumeMounts"] == [
            {"name": "dra-mps-dir", "mountPath": "/mps/gpu.nvidia.com",
             "mountPropagation": "HostToContainer"},
            {"name": "dra-mps-shm", "mountPath": "/dev/shm", "mountPropagation": "HostToContainer"}]
        assert ours["volumes"] == [
            {"name": "dra-mps-dir", "hostPath": {"path": "/var/run/mps/gpu.nvidia.com",
                                                 "type": "DirectoryOrCreate"}},
            {"name": "dra-mps-shm", "hostPath": {"path": "/var/run/mps/gpu.nvidia.com/shm",
                                                 "type": "DirectoryOrCreate"}}]
        assert_valid([ds], DRA_VERSIONS)


def test_without_dra_mps_there_is_none_of_it() -> None:
    values = {"dra": {"mps": False}, "mps": {"enableHostPID": True}}
    ds = daemonset(values)
    assert "MPS_ROOT" not in env(container(ds, CTR))
    assert not [m for m in container(ds, CTR)["volumeMounts"] if m["name"].startswith("mps")]
    assert DRA_MPS not in names(dra_render(values), "DaemonSet")
    assert_valid([ds], DRA_VERSIONS)


def test_the_dra_mps_daemonset_takes_the_mps_image_and_resources_settings() -> None:
    values = {"image": {"repository": "registry.example.com/nvdp", "tag": "9.9.9", "pullPolicy": "Always"},
              "mpsImage": {"repository": "registry.example.com/other", "tag": "8.8.8", "pullPolicy": "Never"},
              "mps": {"resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}}  # fmt: skip
    ds = dra_mps(values)
    spec = ds["spec"]["template"]["spec"]
    for ctr in (*spec["initContainers"], *spec["containers"]):
        assert ctr["image"] == "registry.example.com/other:8.8.8"
        assert ctr["imagePullPolicy"] == "Never"
        assert ctr["resources"] == {"requests": {"cpu": "1m", "memory": "1Mi"}}
    assert_valid([ds], DRA_VERSIONS)


def test_the_dra_plugin_surges_on_upgrade_with_sockets_named_after_its_pod() -> None:
    ds = daemonset()
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    ctr = container(ds, CTR)
    (uid,) = [e for e in ctr["env"] if e["name"] == "POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # null falls back to the chart-wide value (one node at a time, the old pod stopped first).
    assert daemonset({"dra": {"updateStrategy": None}})["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    # The others keep the chart-wide value.
    plugin = render({"dra": {"enabled": True, "defaultMode": "device-plugin"}}).daemonsets()[PLUGIN_DAEMONSET]
    assert plugin["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
