"""One collection end to end, as both plugins make it: the stand-in NVML's processes, a kubelet's
pod-resources answer, the kubelet's device checkpoint or the claims' reservedFor, and a proc tree
laid out as the kubelet's cgroups and mounts are. Runs in a process of its own that loads the
stand-in NVML (tests/usage/collect_probe.py); `nvdp usage` is run the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb
from nvdp.daemon.podresources.client import ContainerHold, HeldClaim, container_holds
from sim.nvml import NodeSim, RunningProcess

from .kubelet_stub import Kubelet, claim, devices, pod, serving

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]
GIB, MIB = 1 << 30, 1 << 20
UID_A, UID_B, UID_C = ("aaaaaaaa-0000-4000-8000-00000000000a", "bbbbbbbb-0000-4000-8000-00000000000b",
                       "cccccccc-0000-4000-8000-00000000000c")


@pytest.fixture
def kubelet() -> Iterator[tuple[str, Kubelet]]:
    with serving() as served:
        yield served


def in_pod(proc: Path, pid: int, uid: str, container: str) -> None:
    """/proc/<pid> of a process in `container` of pod `uid`, as the systemd cgroup driver names it."""
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    cid = f"{pid:064x}"
    (folder / "cgroup").write_text(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                                   f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n")
    (folder / "mountinfo").write_text(f"90 80 8:1 /var/lib/kubelet/pods/{uid}/containers/{container}/0f1e "
                                      "/dev/termination-log rw,relatime - ext4 /dev/sda1 rw\n")


def on_host(proc: Path, pid: int) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text("0::/system.slice/nvidia-mps.service\n")


def checkpoint(path: Path, *entries: tuple[str, str, str, list[str]]) -> Path:
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": uid, "ContainerName": container, "ResourceName": resource, "DeviceIDs": {"-1": ids},
         "AllocResp": ""} for uid, container, resource, ids in entries], "RegisteredDevices": {}},
        "Checksum": 0}))
    return path


class Probe:
    """tests/usage/collect_probe.py on the node's NVML: one collection per call."""

    def __init__(self, node: NodeSim, settings: dict[str, Any]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
        env.update(node.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "tests.usage.collect_probe", json.dumps(settings)]
        self.proc = subprocess.Popen(command, env=env, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "READY"

    def collect(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("collect\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


def figures(answer: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int | None, int]]:
    """(pod, container) -> (memory, SM %, processes) of one collection."""
    return {(u["holder"]["pod"], u["holder"]["container"]): (u["memory_bytes"], u["sm_util"], u["processes"])
            for u in answer["usage"]["uses"]}


def series(answer: dict[str, Any], name: str) -> dict[str, float]:
    """pod -> value of one series in the exposition."""
    found: dict[str, float] = {}
    for line in answer["metrics"].splitlines():
        if line.startswith(name + "{"):
            labels = dict(part.split("=", 1) for part in line[len(name) + 1:line.rindex("}")].split('",'))
            found[labels["pod"].strip('"')] = float(line.rsplit(" ", 1)[1])
    return found


def test_container_holds_reads_devices_and_claims(kubelet: tuple[str, Kubelet]) -> None:
    path, servicer = kubelet
    servicer.answer = pb.ListPodResourcesResponse(pod_resources=[
        pod("a", devices("main", "nvidia.com/gpu", "GPU-1::0"), pb.ContainerResources(name="idle")),
        pod("b", claim("main", "b-gpu", "gpu-0"), namespace="other")])
    assert container_holds(path) == (
        ContainerHold("team", "a", "main", (("nvidia.com/gpu", ("GPU-1::0",)),), ()),
        ContainerHold("other", "b", "main", (), (HeldClaim("team", "b-gpu",
                                                           (("gpu.nvidia.com", "node-a", "gpu-0"),)),)),
    )


def test_device_plugin_two_pods_time_sharing_a_gpu_each_see_their_own(
        kubelet: tuple[str, Kubelet], tmp_path: Path) -> None:
    socket_path, servicer = kubelet
    node = NodeSim("t4", tmp_path / "state")
    gpu = node.inventory.gpus[0].uuid
    proc = tmp_path / "proc"
    in_pod(proc, 1001, UID_A, "main")
    in_pod(proc, 1002, UID_A, "main")
    in_pod(proc, 2001, UID_B, "main")
    in_pod(proc, 4001, UID_C, "spy")  # sees the GPU, holds none of it
    on_host(proc, 3001)  # the MPS server, or a process on the host
    node.set_processes(gpu, [RunningProcess(1001, GIB, sm_util=30),
                             RunningProcess(1002, 512 * MIB, sm_util=5),
                             RunningProcess(2001, 2 * GIB, sm_util=50), RunningProcess(3001, 100 * MIB),
                             RunningProcess(4001, MIB, sm_util=1)])
    resource = "nvidia.com/gpu"
    path = checkpoint(tmp_path / "kubelet_internal_checkpoint", (UID_A, "main", resource, [f"{gpu}::0"]),
                      (UID_B, "main", resource, [f"{gpu}::3"]))
    servicer.answer = pb.ListPodResourcesResponse(pod_resources=[
        pod("a", devices("main", resource, f"{gpu}::0")), pod("b", devices("main", resource, f"{gpu}::3")),
        pod("c", pb.ContainerResources(name="spy"))])
    probe = Probe(node, {"node": "node-a", "socket": socket_path, "proc_root": str(proc),
                         "checkpoint": str(path)})
    try:
        first = probe.collect()
        assert first["usage"]["problems"] == []
        assert figures(first) == {("a", "main"): (GIB + 512 * MIB, 35, 2), ("b", "main"): (2 * GIB, 50, 1)}
        assert series(first, "nvdp_pod_gpu_memory_used_bytes") == {"a": GIB + 512 * MIB, "b": 2 * GIB}
        assert series(first, "nvdp_pod_gpu_sm_utilization_percent") == {"a": 35, "b": 50}
        assert [count for _, count in first["usage"]["others"]] == [2]
        # The stand-in's figures change: the next scrape reads them.
        node.set_processes(gpu, [RunningProcess(2001, 3 * GIB, sm_util=70)])
        assert figures(probe.collect()) == {("a", "main"): (0, 0, 0), ("b", "main"): (3 * GIB, 70, 1)}
        # Pod b deleted: the kubelet no longer lists it, its series are gone at the next scrape.
        servicer.answer = pb.ListPodResourcesResponse(pod_resources=[pod("a", devices("main", resource,
                                                                                      f"{gpu}::0"))])
        gone = probe.collect()
        assert figures(gone) == {("a", "main"): (0, 0, 0)}
        assert series(gone, "nvdp_pod_gpu_memory_used_bytes") == {"a": 0}
        # A pod the checkpoint does not name yet: left out, and said so.
        servicer.answer = pb.ListPodResourcesResponse(pod_resources=[pod("d", devices("main", resource,
                                                                                      f"{gpu}::5"))])
        unknown = probe.collect()
        assert figures(unknown) == {}
        assert unknown["usage"]["problems"] == ["cannot tell the pod UID of team/d; their usage is left out"]
        # Nothing held: nothing read, not even NVML (a GPU that no longer answers goes unnoticed).
        servicer.answer = pb.ListPodResourcesResponse(pod_resources=[
            pod("c", pb.ContainerResources(name="x"))])
        node.unanswering(gpu)
        assert probe.collect()["usage"] == {"node": "node-a", "uses": [], "others": [], "problems": []}
        servicer.answer = pb.ListPodResourcesResponse(pod_resources=[pod("a", devices("main", resource,
                                                                                      f"{gpu}::0"))])
        assert probe.collect()["usage"]["problems"] == [f"cannot read the processes of {gpu} (ERROR_UNKNOWN)"]
        node.unanswering(gpu, on=False)
        path.write_text("{not json")
        broken = probe.collect()["usage"]["problems"]
        assert len(broken) == 2 and "is not a kubelet device checkpoint this version reads" in broken[0]
    finally:
        probe.close()


def test_a_kubelet_that_does_not_answer_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    node = NodeSim("t4", tmp_path / "state")
    probe = Probe(node, {"node": "node-a", "socket": str(tmp_path / "none.sock"), "proc_root": str(tmp_path),
                         "checkpoint": str(tmp_path / "kubelet_internal_checkpoint")})
    try:
        (problem,) = probe.collect()["usage"]["problems"]
        assert problem.startswith(f"cannot ask the kubelet's pod-resources API at {tmp_path}/none.sock")
    finally:
        probe.close()


def test_dra_two_claim_pods_on_one_gpu_and_a_mig_device(kubelet: tuple[str, Kubelet], tmp_path: Path) -> None:
    socket_path, servicer = kubelet
    node = NodeSim("h100-mig-8", tmp_path / "state")
    mig = node.inventory.gpus[1].mig_devices[0]
    proc = tmp_path / "proc"
    in_pod(proc, 1001, UID_A, "main")
    in_pod(proc, 2001, UID_B, "main")
    in_pod(proc, 2002, UID_B, "sidecar")  # a container of b that holds no claim
    node.set_processes(mig.uuid, [RunningProcess(1001, GIB, sm_util=30), RunningProcess(2001, 2 * GIB),
                                  RunningProcess(2002, MIB)])
    name = f"gpu-1-mig-{mig.profile.replace('.', '')}-{mig.gi_profile_id}-{mig.placement_start}"
    claims = tmp_path / "claims.json"
    reserved = {"team/a-gpu": {"status": {"reservedFor": [{"resource": "pods", "name": "a", "uid": UID_A}]}},
                "team/b-gpu": {"status": {"reservedFor": [{"resource": "pods", "name": "b", "uid": UID_B}]}}}
    claims.write_text(json.dumps(reserved))
    servicer.answer = pb.ListPodResourcesResponse(pod_resources=[
        pod("a", claim("main", "a-gpu", name)),
        pod("b", claim("main", "b-gpu", name), pb.ContainerResources(name="sidecar"))])
    probe = Probe(node, {"node": "node-a", "socket": socket_path, "proc_root": str(proc), "checkpoint": None,
                         "driver": "gpu.nvidia.com", "claims": str(claims), "refresh_s": 0})
    try:
        first = probe.collect()
        assert first["usage"]["problems"] == []
        assert figures(first) == {("a", "main"): (GIB, None, 1), ("b", "main"): (2 * GIB, None, 1)}
        assert sorted(first["claim_reads"]) == ["team/a-gpu", "team/b-gpu"]
        labels = [u["holder"] for u in first["usage"]["uses"]]
        assert {(h["claim_name"], h["device_name"], h["driver"]) for h in labels} == {
            ("a-gpu", name, "gpu.nvidia.com"), ("b-gpu", name, "gpu.nvidia.com")}
        assert series(first, "nvdp_pod_gpu_sm_utilization_percent") == {}  # MIG: no per-process figure
        assert [count for _, count in first["usage"]["others"]] == [1]  # b's sidecar
        assert probe.collect()["claim_reads"] == []  # the claims' pods are remembered
        # Pod a made again under its name with a new UID, holding the same claim: read again.
        in_pod(proc, 5001, UID_C, "main")
        node.set_processes(mig.uuid, [RunningProcess(5001, 3 * GIB)])
        reserved["team/a-gpu"]["status"]["reservedFor"][0]["uid"] = UID_C
        claims.write_text(json.dumps(reserved))
        assert figures(probe.collect())[("a", "main")] == (0, None, 0)  # seen: a stranger on its device
        again = probe.collect()
        assert sorted(again["claim_reads"]) == ["team/a-gpu", "team/b-gpu"]  # the claims on that device
        assert figures(again)[("a", "main")] == (3 * GIB, None, 1)
    finally:
        probe.close()


def test_dra_a_mig_device_made_after_the_start_is_found(kubelet: tuple[str, Kubelet], tmp_path: Path) -> None:
    socket_path, servicer = kubelet
    node = NodeSim("h100-mig-dynamic", tmp_path / "state")
    gpu = node.inventory.gpus[0]
    proc = tmp_path / "proc"
    in_pod(proc, 1001, UID_A, "main")
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"team/a-gpu": {"status": {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": UID_A}]}}}))
    servicer.answer = pb.ListPodResourcesResponse(pod_resources=[pod("a", claim("main", "a-gpu", "gpu-0"))])
    probe = Probe(node, {"node": "node-a", "socket": socket_path, "proc_root": str(proc), "checkpoint": None,
                         "driver": "gpu.nvidia.com", "claims": str(claims), "refresh_s": 0})
    try:
        assert figures(probe.collect()) == {}  # gpu-0 is in MIG mode: no process runs on it whole
        made = node.mig_create(gpu.uuid, 19, 0)  # 1g.10gb at slice 0, as a dynamic-MIG prepare makes it
        node.set_processes(made, [RunningProcess(1001, GIB)])
        servicer.answer = pb.ListPodResourcesResponse(pod_resources=[
            pod("a", claim("main", "a-gpu", "gpu-0-mig-1g10gb-19-0"))])
        answer = probe.collect()
        assert answer["usage"]["problems"] == []
        assert figures(answer) == {("a", "main"): (GIB, None, 1)}
    finally:
        probe.close()


def test_nvdp_usage_prints_what_the_series_say(kubelet: tuple[str, Kubelet], tmp_path: Path) -> None:
    socket_path, servicer = kubelet
    node = NodeSim("t4", tmp_path / "state")
    gpu = node.inventory.gpus[0].uuid
    proc = tmp_path / "proc"
    in_pod(proc, 1001, UID_A, "main")
    in_pod(proc, 2001, UID_B, "main")
    node.set_processes(gpu, [RunningProcess(1001, GIB, sm_util=30),
                             RunningProcess(2001, 2 * GIB, sm_util=50)])
    resource = "nvidia.com/gpu"
    path = checkpoint(tmp_path / "kubelet_internal_checkpoint", (UID_A, "main", resource, [f"{gpu}::0"]),
                      (UID_B, "main", resource, [f"{gpu}::1"]))
    servicer.answer = pb.ListPodResourcesResponse(pod_resources=[
        pod("a", devices("main", resource, f"{gpu}::0")), pod("b", devices("main", resource, f"{gpu}::1"))])
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
    env.update(node.env)
    env["NODE_NAME"] = "node-a"
    args = ["--pod-resources-socket", socket_path, "--kubelet-checkpoint", str(path),
            "--proc-root", str(proc)]
    as_json = subprocess.run([sys.executable, "-m", "nvdp.cli", "usage", "-o", "json", *args], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert as_json.returncode == 0, as_json.stderr
    (device,) = json.loads(as_json.stdout)["devices"]
    assert device["uuid"] == gpu and device["model"] == "Tesla T4"
    assert [(p["pod"], p["memoryBytes"], p["smUtilization"]) for p in device["pods"]] == [
        ("a", GIB, 30), ("b", 2 * GIB, 50)]
    probe = Probe(node, {"node": "node-a", "socket": socket_path, "proc_root": str(proc),
                         "checkpoint": str(path)})
    try:
        scraped = probe.collect()
    finally:
        probe.close()
    assert series(scraped, "nvdp_pod_gpu_memory_used_bytes") == {"a": GIB, "b": 2 * GIB}
    as_table = subprocess.run([sys.executable, "-m", "nvdp.cli", "usage", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert as_table.returncode == 0, as_table.stderr
    lines = as_table.stdout.splitlines()
    assert lines[0].split() == ["GPU", "DEVICE", "NAMESPACE", "POD", "CONTAINER", "CLAIM", "MEMORY", "SM",
                                "PROCESSES"]
    assert [line.split()[2:] for line in lines[1:]] == [["team", "a", "main", "-", "1.0", "GiB", "30%", "1"],
                                                         ["team", "b", "main", "-", "2.0", "GiB", "50%", "1"]]
