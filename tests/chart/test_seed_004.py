"""Seed 004: `helm install k8s-device-plugin ... --values values.yaml --set-file config.map.config=<file>`."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_helm import Rendered, container, env, merge_values, render, set_file, values_file

DATA = Path(__file__).parent / "data"
RELEASE = "k8s-device-plugin"
PLUGIN = "k8s-device-plugin-nvidia-device-plugin"
MPS = "k8s-device-plugin-nvidia-device-plugin-mps-control-daemon"


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    values = merge_values(
        values_file(DATA / "seed-004-values.yaml"),
        set_file(f"config.map.config={DATA / 'seed-004-config.yaml'}"),
    )
    return render(values, release=RELEASE)


def test_two_daemonsets_named_as_in_nvidia_chart(rendered: Rendered) -> None:
    assert sorted(rendered.daemonsets()) == [PLUGIN, MPS]


def test_mps_daemon_only_on_labelled_nodes(rendered: Rendered) -> None:
    spec = rendered.daemonsets()[MPS]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
    assert "nodeSelector" not in rendered.daemonsets()[PLUGIN]["spec"]["template"]["spec"]


def test_selectors_do_not_overlap(rendered: Rendered) -> None:
    plugin = rendered.daemonsets()[PLUGIN]["spec"]["selector"]["matchLabels"]
    mps = rendered.daemonsets()[MPS]["spec"]["selector"]["matchLabels"]
    assert plugin["app.kubernetes.io/component"] == "device-plugin"
    assert mps["app.kubernetes.io/component"] == "mps-control-daemon"
    # Neither selector matches the other's pods.
    mps_pod_labels = rendered.daemonsets()[MPS]["spec"]["template"]["metadata"]["labels"]
    assert not all(mps_pod_labels.get(k) == v for k, v in plugin.items())


def test_users_affinity_and_tolerations_replace_defaults(rendered: Rendered) -> None:
    (term,) = values_file(DATA / "seed-004-values.yaml")["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    deploy = "nvidia.com/gpu.deploy.client"
    for ds in rendered.daemonsets().values():
        spec = ds["spec"]["template"]["spec"]
        # The user's term, on nodes the GPU Operator has not paused (label "true" or absent).
        assert spec["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [*term["matchExpressions"],
                                      {"key": deploy, "operator": "In", "values": ["true"]}]},
                {"matchExpressions": [*term["matchExpressions"],
                                      {"key": deploy, "operator": "DoesNotExist"}]},
            ]}}}
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]


def test_one_config_entry_gets_no_api_access(rendered: Rendered) -> None:
    # One entry is every node's config whatever its labels say: nothing to watch, no Events asked
    # for (events.enabled false), so no role, no binding and no token in any pod, as the kubelet's
    # socket and the MPS pipes are all these pods talk to.
    kinds = {o["kind"] for o in rendered.objects}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    assert rendered.one("ServiceAccount")["automountServiceAccountToken"] is False
    for ds in rendered.daemonsets().values():
        assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    # and no egress to the API server through the deny-all policy
    assert "egress" not in rendered.one("NetworkPolicy")["spec"]


def test_configmap_holds_the_file_verbatim(rendered: Rendered) -> None:
    cm = rendered.one("ConfigMap", f"{PLUGIN}-configs")
    assert cm["data"] == {"config": (DATA / "seed-004-config.yaml").read_text(encoding="utf-8")}


def test_both_pods_choose_the_entry_from_the_configmap(rendered: Rendered) -> None:
    from nvdp.config.select import parse_fallbacks, select_entry

    for name, ctr in [(PLUGIN, "nvidia-device-plugin-ctr"), (MPS, "mps-control-daemon-ctr")]:
        ds = rendered.daemonsets()[name]
        variables = env(container(ds, ctr))
        assert variables["CONFIG_DIR"] == "/available-configs" and "CONFIG_FILE" not in variables
        volumes = ds["spec"]["template"]["spec"]["volumes"]
        volume = next(v for v in volumes if v["name"] == "available-configs")
        assert volume["configMap"] == {"name": f"{PLUGIN}-configs"}
        # the daemons' own rule picks the only entry on an unlabelled node
        chosen = select_entry(["config"], None, variables.get("DEFAULT_CONFIG"),
                              parse_fallbacks(variables["FALLBACK_STRATEGIES"]))
        assert chosen.entry == "config"


def test_mps_root_shared_by_both_pods(rendered: Rendered) -> None:
    plugin = rendered.daemonsets()[PLUGIN]
    assert env(container(plugin, "nvidia-device-plugin-ctr"))["MPS_ROOT"] == "/run/nvidia/mps"
    for ds in rendered.daemonsets().values():
        volumes = {
            v["name"]: v["hostPath"]["path"]
            for v in ds["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v
        }
        assert volumes["mps-root"] == "/run/nvidia/mps"
        assert volumes["mps-shm"] == "/run/nvidia/mps/shm"


def test_mps_init_container_mounts_shm_in_the_host_namespace(rendered: Rendered) -> None:
    # hostPID (the default): the mount is made in the host's mount namespace, so no Bidirectional
    # propagation and no shared mount on the host are needed.
    ds = rendered.daemonsets()[MPS]
    init = container(ds, "mps-control-daemon-mounts")
    assert init["command"] == ["mps-control-daemon", "mount-shm"]
    assert init["image"] == "ghcr.io/nvdp-project/nvdp-mps-daemon:0.1.0"
    assert init["securityContext"] == {"privileged": True}
    assert init["volumeMounts"] == [{"name": "mps-root", "mountPath": "/mps"}]
    assert env(init) == {"MPS_ROOT": "/run/nvidia/mps", "MPS_MOUNT_IN_HOST_NAMESPACE": "true"}
    assert ds["spec"]["template"]["spec"]["hostPID"] is True


def test_without_host_pid_the_init_container_uses_bidirectional_propagation() -> None:
    values = merge_values(
        values_file(DATA / "seed-004-values.yaml"),
        set_file(f"config.map.config={DATA / 'seed-004-config.yaml'}"),
        {"mps": {"enableHostPID": False}},
    )
    ds = render(values, release=RELEASE).daemonsets()[MPS]
    init = container(ds, "mps-control-daemon-mounts")
    assert init["volumeMounts"] == [
        {"name": "mps-root", "mountPath": "/mps", "mountPropagation": "Bidirectional"}
    ]
    assert env(init)["MPS_MOUNT_IN_HOST_NAMESPACE"] == "false"


def test_notes_say_how_to_label_mps_nodes_and_see_gpus(rendered: Rendered) -> None:
    assert "kubectl label node <node> nvidia.com/mps.capable=true" in rendered.notes
    assert (
        "kubectl get nodes -o custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu"
        in rendered.notes
    )


def test_the_daemons_run_their_entry_in_the_pod_without_a_token(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The plugin and the MPS daemon, with the env the chart gives them and the pod's view of the
    API (KUBERNETES_SERVICE_HOST set by the kubelet, no token mounted): they start on the entry, and
    the log says why the node label is not read."""
    import argparse
    import logging

    from nvdp.daemon.pernode.nodeconfig import follow
    from nvdp.kube import KubeConnectError, connect
    from nvdp.kube.connect import SERVICE_ACCOUNT_DIR

    if (SERVICE_ACCOUNT_DIR / "token").exists():
        pytest.skip(f"this machine has a service account token at {SERVICE_ACCOUNT_DIR}")
    entries = tmp_path / "available-configs"
    entries.mkdir()
    (entries / "config").write_text((DATA / "seed-004-config.yaml").read_text(encoding="utf-8"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConnectError, match="this pod has no service account token"):
        connect()
    for name, ctr in [(PLUGIN, "nvidia-device-plugin-ctr"), (MPS, "mps-control-daemon-ctr")]:
        given = env(container(rendered.daemonsets()[name], ctr))
        variables = {k: v for k, v in given.items() if v is not None}
        # NODE_NAME comes from the downward API; the entries from the ConfigMap volume.
        variables |= {"CONFIG_DIR": str(entries), "NODE_NAME": "gpu-node"}
        log = logging.getLogger(f"seed-004-{name}")
        with caplog.at_level(logging.INFO, logger=log.name):
            node_config = follow(argparse.Namespace(), variables, lambda: None, log)
        assert node_config is not None
        try:
            assert node_config.choose(lenient=True).entry == "config"
        finally:
            node_config.stop()
        assert "no service account token" in caplog.text
        # One entry and no token is this install working as intended, not an error to chase.
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert "is not followed: one config entry (config)" in caplog.text
        caplog.clear()
