"""Each holder's use: its own processes on its device, none of another pod's."""

from __future__ import annotations

from nvdp.inventory.processes import DeviceProcesses, ProcessUse
from nvdp.usage.attribute import attribute
from nvdp.usage.model import DeviceInfo, Holder, Owner, Use

GPU, MIG = "GPU-aaaa", "MIG-cccc"
UID_A, UID_B, UID_C = "uid-a", "uid-b", "uid-c"
GPU_INFO = DeviceInfo(GPU, GPU, 0, 0, "Tesla T4")
MIG_INFO = DeviceInfo(MIG, "GPU-bbbb", 1, 1, "NVIDIA H100 80GB HBM3", mig_gi_id=7, mig_profile="1g.10gb")
INFOS = {GPU: GPU_INFO, MIG: MIG_INFO}
A = Holder(GPU, "team", "a", "main", UID_A, resource="nvidia.com/gpu")
B = Holder(GPU, "team", "b", "main", UID_B, resource="nvidia.com/gpu")
B_SIDE = Holder(GPU, "team", "b", "side", UID_B, resource="nvidia.com/gpu")
M = Holder(MIG, "team", "m", "main", UID_C, resource="nvidia.com/mig-1g.10gb")
GIB = 1 << 30


def test_two_pods_time_sharing_a_gpu_each_get_their_own_processes() -> None:
    gpu = DeviceProcesses(GPU, GPU, (ProcessUse(10, GIB, 30), ProcessUse(11, 2 * GIB, 5),
                                     ProcessUse(20, GIB, 40)))
    owners = {10: Owner(UID_A, "c1", "main"), 11: Owner(UID_A, "c1", "main"), 20: Owner(UID_B, "c2", "main")}
    uses, others = attribute([gpu], INFOS, [A, B], owners)
    assert uses == (Use(GPU_INFO, A, 3 * GIB, 35, 2), Use(GPU_INFO, B, GIB, 40, 1))
    assert others == ()


def test_a_holder_without_processes_uses_nothing_and_strangers_go_to_others() -> None:
    gpu = DeviceProcesses(GPU, GPU, (ProcessUse(30, GIB, 50), ProcessUse(31, GIB, 5),
                                     ProcessUse(32, None, 0)))
    # 30: a pod that sees the GPU without holding it; 31: a host process (the MPS server); 32: gone.
    owners = {30: Owner(UID_C, "c3", "spy")}
    uses, others = attribute([gpu], INFOS, [A], owners)
    assert uses == (Use(GPU_INFO, A, 0, 0, 0),)
    assert others == ((GPU_INFO, 3),)


def test_the_container_decides_among_a_pods_holders() -> None:
    gpu = DeviceProcesses(GPU, GPU, (ProcessUse(40, GIB, 10), ProcessUse(41, GIB, 20),
                                     ProcessUse(42, GIB, 30), ProcessUse(43, GIB, 1)))
    owners = {40: Owner(UID_B, "c4", "side"), 41: Owner(UID_B, "c5", "main"),
              42: Owner(UID_B, "c6", ""),  # its container's name unknown: the pod's first holder
              43: Owner(UID_B, "c7", "init")}  # a container of the pod that does not hold the GPU
    uses, others = attribute([gpu], INFOS, [B, B_SIDE], owners)
    assert uses == (Use(GPU_INFO, B, 2 * GIB, 50, 2), Use(GPU_INFO, B_SIDE, GIB, 10, 1))
    assert others == ((GPU_INFO, 1),)


def test_mig_devices_have_memory_but_no_utilization_and_unread_devices_nothing() -> None:
    mig = DeviceProcesses(MIG, "GPU-bbbb", (ProcessUse(50, GIB, None),), utilization=False)
    uses, others = attribute([mig], INFOS, [A, M], {50: Owner(UID_C, "c8", "main")})
    assert uses == (Use(MIG_INFO, M, GIB, None, 1),)  # A's GPU was not read: no figure rather than 0
    assert others == ()
    assert attribute([], INFOS, [A, M], {}) == ((), ())
    assert attribute([DeviceProcesses("GPU-new", "GPU-new", ())], INFOS, [A], {}) == ((), ())
