"""Seed 004 on a real node: a T4 shared with MPS (10 replicas), installed with the user's own values.

One release walks through a node's life, in order: the MPS daemon is gated until the node is labelled,
then 10 replicas; pods get the MPS pipe and /dev/shm; the 11th pod waits; the kubelet restarts; an XID
takes the GPU away and a SIGHUP re-plan brings it back; an upgrade switches to time-slicing; uninstall
leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .e2e_cluster import DATA, GPU, MPS_ROOT, Cluster, Images, Release, Timings, gpu_pod

SCENARIO = "seed 004 (MPS x10)"
pytestmark = pytest.mark.incremental
T4_UUID = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
MPS_LABEL = "nvidia.com/mps.capable"
WORKLOADS = "nvdp-e2e=workload"


@pytest.fixture(scope="module")
def release(cluster: Cluster, images: Images) -> Iterator[Release]:
    # seed 004's own affinity: nodes labelled serverType=gpu
    cluster.label({"serverType": "gpu", MPS_LABEL: None})
    release = Release(cluster, images, "nvdp", "nvdp-e2e-mps")
    yield release
    cluster.kubectl("delete", "pods", "-n", "default", "-l", WORKLOADS, "--grace-period=0", "--wait=false",
                    check=False)  # fmt: skip
    release.uninstall()
    cluster.label({"serverType": None, MPS_LABEL: None})
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def test_install_with_seed_values_gates_the_mps_daemon(
    cluster: Cluster, release: Release, timings: Timings
) -> None:
    with timings.measure(SCENARIO, "helm install --wait (-f values, --set-file config)"):
        config = f"config.map.config={DATA / 'seed-004-config.yaml'}"
        done = release.install("-f", str(DATA / "seed-004-values.yaml"), "--set-file", config)
    assert f"kubectl label node <node> {MPS_LABEL}=true" in done.stdout, (
        "NOTES say how to start the MPS daemon"
    )
    assert not release.pods("mps-control-daemon"), "no node is labelled for MPS yet"
    wanted = f"fix: kubectl label node {cluster.node} {MPS_LABEL}=true"
    _, seconds = cluster.wait_for("the plugin to say why it waits", lambda: wanted in release.logs(), 60,
                                  diagnose=release.logs)  # fmt: skip
    timings.add(SCENARIO, "installed -> plugin log names the label", seconds)
    assert cluster.allocatable() in (None, 0)


def test_labelling_the_node_gives_10(cluster: Cluster, release: Release, timings: Timings) -> None:
    cluster.label({MPS_LABEL: "true"})
    timings.add(
        SCENARIO, "label -> allocatable 10", cluster.wait_allocatable(10, namespace=release.namespace)
    )
    (daemon,) = release.pods("mps-control-daemon")
    assert daemon["status"]["phase"] == "Running"
    # The tmpfs MPS clients share, mounted in the host's mount namespace (no Bidirectional propagation).
    assert f" {MPS_ROOT}/shm tmpfs " in cluster.host("cat /proc/mounts").stdout


def test_pods_get_the_mps_env_and_mounts(cluster: Cluster, release: Release, images: Images) -> None:
    cluster.apply(gpu_pod("mps-client-0", images.plugin))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/mps-client-0", "--timeout=60s")
    env = cluster.exec("default", "mps-client-0", "env")
    assert f"CUDA_MPS_PIPE_DIRECTORY=/mps/{GPU}/pipe" in env.splitlines()
    assert f"NVIDIA_VISIBLE_DEVICES={T4_UUID}" in env.splitlines()
    mounts = cluster.exec("default", "mps-client-0", "cat", "/proc/mounts")
    targets = {line.split()[1] for line in mounts.splitlines()}
    assert f"/mps/{GPU}/pipe" in targets and "/dev/shm" in targets, mounts
    (shm,) = [line.split() for line in mounts.splitlines() if line.split()[1] == "/dev/shm"]
    assert shm[2] == "tmpfs" and "size=65536k" not in shm[3], "the MPS tmpfs, not the pod's own 64 MiB one"
    listing = cluster.exec("default", "mps-client-0", "ls", f"/mps/{GPU}/pipe")
    assert "control" in listing.split(), "the daemon's control socket is in the pod's pipe directory"


def test_ten_pods_run_and_the_eleventh_waits(cluster: Cluster, release: Release, images: Images,
                                             timings: Timings) -> None:  # fmt: skip
    with timings.measure(SCENARIO, "10 more pods created -> 10 Running, 1 Pending"):
        cluster.apply([gpu_pod(f"mps-client-{i}", images.plugin) for i in range(1, 11)])

        def settled() -> tuple[int, list[str]] | None:
            pods = cluster.pods("default", WORKLOADS)
            running = sum(p["status"].get("phase") == "Running" for p in pods)
            pending = [
                p["metadata"]["name"]
                for p in pods
                if p["status"].get("phase") == "Pending"
                and any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
            ]
            return (running, pending) if running == 10 and len(pending) == 1 else None

        cluster.wait_for("10 Running and 1 Pending", settled, timeout=120)
    events = cluster.kubectl(
        "get", "events", "-n", "default", "--field-selector", "reason=FailedScheduling"
    ).stdout
    assert f"Insufficient {GPU}" in events


def test_kubelet_restart_gives_10_again(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "kubelet restart (stop + node-up.sh)"):
        cluster.restart_kubelet()
    timings.add(
        SCENARIO, "kubelet back -> allocatable 10", cluster.wait_allocatable(10, namespace=release.namespace)
    )


def test_an_xid_takes_the_gpu_away(cluster: Cluster, release: Release, timings: Timings) -> None:
    cluster.inject_xid(T4_UUID, 48)
    timings.add(SCENARIO, "XID 48 -> allocatable 0", cluster.wait_allocatable(0, namespace=release.namespace))
    # Just after a kubelet restart the API server may not reach the kubelet's log endpoint yet.
    cluster.wait_for("the plugin to log the XID", lambda: "XID 48" in release.logs(), 30, every=1)


def test_a_sighup_keeps_the_gpu_down_and_nvdp_health_clear_brings_it_back(
    cluster: Cluster, release: Release, timings: Timings
) -> None:
    # XID 48 needs a GPU reset: a re-plan does not bring the GPU back, clearing it by hand does.
    (plugin,) = release.pods("device-plugin")
    name = plugin["metadata"]["name"]
    cluster.exec(release.namespace, name, "bash", "-c", "kill -HUP 1")
    cluster.wait_for("the re-plan", lambda: "Reload applied" in release.logs() or None, 30, every=1)
    assert cluster.allocatable() == 0
    with timings.measure(SCENARIO, "nvdp health clear -> allocatable 10"):
        cluster.exec(release.namespace, name, "nvdp", "health", "clear", T4_UUID)
        cluster.wait_allocatable(10, namespace=release.namespace)
    assert cluster.allocatable() == 10


def mps_daemon_pods(release: Release) -> dict[str, bool]:
    """The MPS control-daemon pods: name -> Ready."""
    return {p["metadata"]["name"]: any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in p["status"].get("conditions") or [])
            for p in release.pods("mps-control-daemon")}


def test_an_upgrade_of_the_mps_daemon_waits_until_no_pod_uses_mps(
    cluster: Cluster, release: Release, timings: Timings
) -> None:
    """mps.upgrade whenIdle (the default): with ten MPS pods running, `helm upgrade` starts the new daemon
    pod beside the old one, not Ready; the old daemon (same PID) serves on; the device plugin's Event and
    `nvdp doctor` name the pods. Once they end, the new pod turns Ready, the DaemonSet controller retires
    the old one, and the new pod's daemon serves the node."""
    pid_file = f"{MPS_ROOT}/{GPU}/pipe/nvidia-cuda-mps-control.pid"
    pid = cluster.host(f"cat {pid_file}").stdout.strip()
    (old,) = mps_daemon_pods(release)
    started = time.monotonic()
    release.upgrade("-f", str(DATA / "seed-004-values.yaml"), "--set-file",
                    f"config.map.config={DATA / 'seed-004-config.yaml'}",
                    "--set", "podAnnotations.nvdp-e2e-mps=upgraded", wait=False)  # fmt: skip
    (new,), seconds = cluster.wait_for(
        "a second MPS daemon pod", lambda: [n for n in mps_daemon_pods(release) if n != old] or None, 60,
        every=1)  # fmt: skip
    timings.add(SCENARIO, "helm upgrade (no --wait) -> new MPS daemon pod beside the old one", seconds)
    cluster.wait_for("the new pod to say which pods it waits for",
                     lambda: "default/mps-client-0" in release.logs("mps-control-daemon"), 60, every=1)
    (plugin,) = cluster.wait_for("the upgraded device plugin, Ready",
                                 lambda: [p for p in release.pods("device-plugin") if all(
                                     c.get("ready") for c in p["status"].get("containerStatuses") or [{}])]
                                 or None, 120, every=1)[0]  # fmt: skip

    def waiting_event() -> str | None:
        # One config entry: the device plugin has no API access, so the kubelet's Event on the waiting pod
        # (its readiness probe prints what it waits for) says it.
        events = cluster.kubectl_json("get", "events", "-n", release.namespace, "--field-selector",
                                      f"involvedObject.name={new},reason=Unhealthy")["items"]
        return next((e["message"] for e in events if "has waited since" in e["message"]), None)

    message, _ = cluster.wait_for("the waiting pod's Unhealthy Event", waiting_event, 60, every=1)
    assert "default/mps-client-0" in message and cluster.node in message, message
    doctor = cluster.kubectl("exec", "-n", release.namespace, plugin["metadata"]["name"], "--", "nvdp",
                             "doctor", check=False).stdout
    assert "an upgrade of the MPS daemon waits" in doctor and "default/mps-client-0" in doctor, doctor
    assert mps_daemon_pods(release) == {old: True, new: False}, "the new pod waits, not Ready"
    assert cluster.host(f"cat {pid_file}").stdout.strip() == pid, "the same MPS control daemon serves on"
    running = [p for p in cluster.pods("default", WORKLOADS) if p["status"].get("phase") == "Running"]
    assert len(running) == 10, "every MPS client pod runs on"
    assert not any(c.get("restartCount") for p in running for c in p["status"].get("containerStatuses") or [])

    cluster.kubectl("delete", "pods", "-n", "default", "-l", WORKLOADS, "--grace-period=0")
    _, seconds = cluster.wait_for(
        "the new MPS daemon pod alone, Ready",
        lambda: mps_daemon_pods(release) == {new: True} or None, 120, every=1,
        diagnose=lambda: release.logs("mps-control-daemon"))  # fmt: skip
    timings.add(SCENARIO, "MPS pods deleted -> the new MPS daemon pod took over", seconds)
    timings.add(SCENARIO, "helm upgrade -> MPS daemon replaced (ten MPS pods ran meanwhile)",
                time.monotonic() - started)
    timings.add(SCENARIO, "took over -> allocatable 10",
                cluster.wait_allocatable(10, namespace=release.namespace))
    assert cluster.host(f"cat {pid_file}", check=False).stdout.strip() != pid, "the new pod's daemon"


CONFIGMAP_PROPAGATION_S = 180


def test_upgrade_to_time_slicing(cluster: Cluster, release: Release, timings: Timings) -> None:
    cluster.kubectl("delete", "pods", "-n", "default", "-l", WORKLOADS, "--grace-period=0")
    with timings.measure("upgrade to time-slicing x4", "helm upgrade --wait"):
        release.upgrade("-f", str(DATA / "seed-004-values.yaml"),
                        "--set-file", f"config.map.config={DATA / 'time-slicing-4.yaml'}")  # fmt: skip
    cluster.refresh_config_volumes(release.namespace, release.selector)
    timings.add(
        "upgrade to time-slicing x4",
        "upgraded -> allocatable 4",
        # The config reaches the plugin through its mounted ConfigMap, which the kubelet refreshes at a
        # pod sync (refresh_config_volumes asks for one; without it, up to about two minutes).
        cluster.wait_allocatable(4, timeout=CONFIGMAP_PROPAGATION_S, namespace=release.namespace),
    )
    cluster.wait_for("the MPS daemon's pods to go", lambda: not release.pods("mps-control-daemon"), 60)
    assert not [name for name in release.daemonsets() if "mps" in name]


def test_uninstall_leaves_nothing_behind(cluster: Cluster, release: Release, timings: Timings) -> None:
    with timings.measure(SCENARIO, "helm uninstall --wait -> no pods"):
        release.uninstall()
        cluster.wait_for("the release's pods to go", lambda: not release.pods(), 60)
    left = cluster.kubectl("get", "all,configmaps,serviceaccounts,networkpolicies", "-n", release.namespace,
                           "-l", release.selector, "-o", "name").stdout  # fmt: skip
    assert left.strip() == ""
    sockets = cluster.host("ls /var/lib/kubelet/device-plugins").stdout.split()
    assert [s for s in sockets if s != "kubelet.sock" and not s.startswith("kubelet_internal")] == []
    # The MPS daemon's tmpfs, pipe and readiness marker are gone; its bounded log and status, the empty
    # folders the kubelet made for the hostPath volumes and the stand-in NVML's state stay, as the chart
    # README says.
    mounts = cluster.host(f"grep ' {MPS_ROOT}/' /proc/mounts || true").stdout
    assert mounts.strip() == "", mounts
    listing = cluster.host(f"cd {MPS_ROOT} && find . -mindepth 1").stdout
    # (./gpu.nvidia.com is the DRA plugin's MPS folder, of the DRA scenarios, and the stand-in's state)
    host_left = {p for p in listing.split() if not p.startswith("./gpu.nvidia.com")}
    kept = {f"./{GPU}/status.json", f"./{GPU}/log"}
    # (log/limits-set.jsonl: the stand-in nvidia-cuda-mps-control's record of the limits it was set to)
    assert host_left <= {"./shm", "./nvidia.com", f"./{GPU}", *kept, f"./{GPU}/log/limits-set.jsonl",
                         f"./{GPU}/log/control.log", f"./{GPU}/log/control.log.1"}, host_left  # fmt: skip
