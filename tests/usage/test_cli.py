"""`nvdp usage`'s table and JSON from one collection."""

from __future__ import annotations

from nvdp.cli.usage import document, table
from nvdp.usage.model import Usage

from .test_series import USAGE


def test_the_table_lists_each_gpu_with_its_pods_and_other_processes() -> None:
    assert table(USAGE).splitlines() == [
        "GPU        DEVICE    NAMESPACE    POD  CONTAINER  CLAIM       MEMORY     SM   PROCESSES",
        "0          GPU-aaaa  team         a    main       -           1.0 GiB    35%  2",
        "0          GPU-aaaa  (no holder)  -    -          -           -          -    1",
        "1 1g.10gb  MIG-cccc  team         b    main       team/b-gpu  512.0 MiB  -    1",
    ]


def test_nothing_held_says_so_and_problems_print_no_table() -> None:
    assert table(Usage("node-a")) == "No pod holds a GPU this node's plugins handed out.\n"
    assert table(Usage("node-a", problems=("x",))) == ""


def test_the_json_groups_pods_by_device() -> None:
    doc = document(USAGE)
    assert doc["node"] == "node-a" and doc["problems"] == []
    gpu, mig = doc["devices"]
    assert (gpu["gpu"], gpu["uuid"], gpu["model"], gpu["device"], gpu["mig"], gpu["otherProcesses"]) == (
        0, "GPU-aaaa", "Tesla T4", "nvidia0", None, 1)
    assert gpu["pods"] == [{"namespace": "team", "pod": "a", "container": "main", "podUID": "uid-a",
                            "resource": "nvidia.com/gpu", "claim": None, "memoryBytes": 1 << 30,
                            "smUtilization": 35, "processes": 2}]
    assert mig["mig"] == {"profile": "1g.10gb", "gpuInstance": 7}
    assert mig["pods"][0]["claim"] == {"namespace": "team", "name": "b-gpu", "driver": "gpu.nvidia.com",
                                       "pool": "node-a", "device": "gpu-3-mig-1g10gb-19-0"}
    assert mig["pods"][0]["smUtilization"] is None
