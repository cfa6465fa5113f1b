"""The device plugin's usage series over HTTP from the running plugin process (stand-in NVML, kubelet
simulator, a pod-resources stand-in), its processes real ones placed in cgroups named as the kubelet
names a pod's, so that the plugin reads /proc as it does on a node."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim
from sim.nvml import RunningProcess
from tests.integration.scrape import free_port, scrape, value, wait_for_http
from tests.usage.kubelet_stub import Kubelet, devices, pod, serving

from .conftest import MakePlugin

pytestmark = pytest.mark.slow

GIB = 1 << 30
GPU = "nvidia.com/gpu"
# Where a test may make cgroups: cgroup v1's pids hierarchy, or the unified one.
CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class PodProcess:
    """A `sleep` in its own cgroup `kubepods/pod<uid>/<container id>`, as the cgroupfs driver names it."""

    def __init__(self, root: Path, pod_uid: str) -> None:
        self.pod_uid = pod_uid
        self.container_id = uuid.uuid4().hex * 2
        self.folder = root / "nvdp-test-kubepods" / f"pod{pod_uid}" / self.container_id
        self.folder.mkdir(parents=True)
        self.proc = subprocess.Popen(["sleep", "120"])
        (self.folder / "cgroup.procs").write_text(str(self.proc.pid))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def pod_processes() -> Iterator[list[PodProcess]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test puts processes in cgroups named as the kubelet names a pod's")
    root = next((Path(r) for r in CGROUP_ROOTS if os.access(f"{r}/cgroup.procs", os.W_OK)), None)
    if root is None:
        pytest.skip(f"no writable cgroup hierarchy at {', '.join(CGROUP_ROOTS)}")
    try:
        made = [PodProcess(root, str(uuid.uuid4())) for _ in range(2)]
    except OSError as err:
        shutil.rmtree(root / "nvdp-test-kubepods", ignore_errors=True)
        pytest.skip(f"cannot move a process into a new cgroup under {root}: {err}")
    yield made
    for each in made:
        each.end()
    for folder in sorted((root / "nvdp-test-kubepods").glob("**/"), key=lambda p: -len(p.parts)):
        folder.rmdir()  # empty cgroups go with rmdir, their control files with them


@pytest.fixture
def kubelet_pods() -> Iterator[tuple[str, Kubelet]]:
    with serving() as served:
        yield served


def test_each_pod_sharing_a_gpu_gets_its_own_series_and_loses_them_when_it_goes(
        make_plugin: MakePlugin, kubelet: KubeletSim, kubelet_pods: tuple[str, Kubelet],
        pod_processes: list[PodProcess], plugin_dir: Path, tmp_path: Path) -> None:
    socket_path, pods = kubelet_pods
    a, b = pod_processes
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                      f"    - name: {GPU}\n      replicas: 2\n")
    port = free_port()
    plugin, node = make_plugin("t4", CONFIG_FILE=str(config), NODE_NAME="node-a",
                               KUBELET_POD_RESOURCES_SOCKET=socket_path)
    gpu = node.inventory.gpus[0].uuid
    # What the kubelet keeps and answers once it gave each pod a replica.
    (plugin_dir / "kubelet_internal_checkpoint").write_text(
        '{"Data": {"PodDeviceEntries": ['
        f'{{"PodUID": "{a.pod_uid}", "ContainerName": "main", "ResourceName": "{GPU}", '
        f'"DeviceIDs": {{"-1": ["{gpu}::0"]}}, "AllocResp": ""}}, '
        f'{{"PodUID": "{b.pod_uid}", "ContainerName": "main", "ResourceName": "{GPU}", '
        f'"DeviceIDs": {{"-1": ["{gpu}::1"]}}, "AllocResp": ""}}]}}}}')
    pods.holds(pod("a", devices("main", GPU, f"{gpu}::0")), pod("b", devices("main", GPU, f"{gpu}::1")))
    node.set_processes(gpu, [RunningProcess(a.pid, GIB, sm_util=20),
                             RunningProcess(b.pid, 2 * GIB, sm_util=45),
                             RunningProcess(os.getpid(), 5 << 20)])  # this test: in no pod
    plugin.start(f"--metrics-address=127.0.0.1:{port}", "--usage-metrics")
    kubelet.wait_for_resource(GPU, count=2, timeout=10)
    wait_for_http(port, "/readyz", 200)

    def pod_values(name: str) -> dict[str, float]:
        samples = scrape(port)
        return {dict(labels)["pod"]: v for (series, labels), v in samples.items() if series == name}

    samples = scrape(port)
    common = {"gpu": "0", "UUID": gpu, "device": "nvidia0", "modelName": "Tesla T4", "hostname": "node-a",
              "GPU_I_PROFILE": "", "GPU_I_ID": "", "namespace": "team", "container": "main",
              "dra_claim_namespace": "", "dra_claim_name": "", "dra_driver_name": "", "dra_pool_name": "",
              "dra_device_name": ""}
    for name, process, memory, util in (("a", a, GIB, 20), ("b", b, 2 * GIB, 45)):
        labels = {**common, "pod": name, "pod_uid": process.pod_uid}
        assert value(samples, "nvdp_pod_gpu_memory_used_bytes", **labels) == memory, samples
        assert value(samples, "nvdp_pod_gpu_sm_utilization_percent", **labels) == util
    device = {k: common[k] for k in ("gpu", "UUID", "device", "modelName", "hostname", "GPU_I_PROFILE",
                                     "GPU_I_ID")}
    assert value(samples, "nvdp_gpu_unattributed_processes", **device) == 1
    assert value(samples, "nvdp_usage_collection_problems") == 0
    # Pod b ends: the kubelet lists it no more, and the next scrape has no series of it.
    b.end()
    pods.holds(pod("a", devices("main", GPU, f"{gpu}::0")))
    assert pod_values("nvdp_pod_gpu_memory_used_bytes") == {"a": GIB}
    # Nothing held: no usage series, and no problem.
    pods.holds()
    assert pod_values("nvdp_pod_gpu_memory_used_bytes") == {}
    assert value(scrape(port), "nvdp_usage_collection_problems") == 0
    plugin.stop()
    assert "Usage metrics:" not in plugin.log  # no problem was ever logged
