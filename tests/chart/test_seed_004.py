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
    expected_affinity = values_file(DATA / "seed-004-values.yaml")["affinity"]
    for ds in rendered.daemonsets().values():
        spec = ds["spec"]["template"]["spec"]
        assert spec["affinity"] == expected_affinity
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]


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
