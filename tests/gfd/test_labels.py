"""GPU feature discovery labels per stand-in profile and sharing mode.

The expected sets are written out by hand from NVIDIA's label reference (keys, value formats:
sanitised products, `-SHARED`, replicas 0 for MIG-enabled GPUs, `-MIG-INVALID`), not computed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.config.loader import load_config_text
from nvdp.config.model import Config
from nvdp.gfd.labels import (
    HostFacts,
    LabelError,
    family,
    gfd_labels,
    gpu_mode_from_pci_class,
    sanitise,
    with_timestamp,
)
from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile
from nvdp.plan import PlanError, plan

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"
N = "nvidia.com/"


def node(profile: str) -> Inventory:
    return load_profile(PROFILES / f"{profile}.yaml")


def config(text: str = "version: v1\n") -> Config:
    return load_config_text(text, "test.yaml", env={})


def labels_for(profile: str, text: str = "version: v1\n", host: HostFacts | None = None) -> dict[str, str]:
    inv = node(profile)
    cfg = config(text)
    try:
        p = plan(cfg, inv)
    except PlanError:
        p = None
    return gfd_labels(inv, p, cfg.flags.mig_strategy, host or HostFacts())


def versions(driver: str, rev: str, cuda: str) -> dict[str, str]:
    major, minor = driver.split(".")[:2]
    cmaj, cmin = cuda.split(".")
    return {
        N + "cuda.driver.major": major,
        N + "cuda.driver.minor": minor,
        N + "cuda.driver.rev": rev,
        N + "cuda.runtime.major": cmaj,
        N + "cuda.runtime.minor": cmin,
        N + "cuda.driver-version.major": major,
        N + "cuda.driver-version.minor": minor,
        N + "cuda.driver-version.revision": rev,
        N + "cuda.driver-version.full": driver,
        N + "cuda.runtime-version.major": cmaj,
        N + "cuda.runtime-version.minor": cmin,
        N + "cuda.runtime-version.full": cuda,
    }


T4_BASE = {
    N + "gpu.machine": "unknown",
    **versions("550.54.15", "15", "12.4"),
    N + "mig.capable": "false",
    N + "mps.capable": "false",
    N + "gpu.product": "Tesla-T4",
    N + "gpu.count": "1",
    N + "gpu.replicas": "1",
    N + "gpu.sharing-strategy": "none",
    N + "gpu.memory": "15360",
    N + "gpu.family": "turing",
    N + "gpu.compute.major": "7",
    N + "gpu.compute.minor": "5",
    N + "gpu.mode": "unknown",
}

TS_4 = """
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
TS_4_RENAMED = """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
MPS_10 = """
version: v1
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 10
"""


def test_t4_unshared() -> None:
    assert labels_for("t4") == T4_BASE


def test_t4_time_slicing_appends_shared() -> None:
    assert labels_for("t4", TS_4) == {
        **T4_BASE,
        N + "gpu.product": "Tesla-T4-SHARED",
        N + "gpu.replicas": "4",
        N + "gpu.sharing-strategy": "time-slicing",
    }


def test_t4_time_slicing_renamed_keeps_the_product() -> None:
    assert labels_for("t4", TS_4_RENAMED) == {
        **T4_BASE,
        N + "gpu.replicas": "4",
        N + "gpu.sharing-strategy": "time-slicing",
    }


def test_t4_mps_is_mps_capable() -> None:
    assert labels_for("t4", MPS_10) == {
        **T4_BASE,
        N + "gpu.product": "Tesla-T4-SHARED",
        N + "gpu.replicas": "10",
        N + "gpu.sharing-strategy": "mps",
        N + "mps.capable": "true",
    }


def test_replicas_one_is_unshared() -> None:
    assert labels_for("t4", TS_4.replace("replicas: 4", "replicas: 1")) == T4_BASE


def test_machine_and_mode_come_from_host_facts() -> None:
    labels = labels_for("t4", host=HostFacts(machine="Google Compute Engine", gpu_mode="compute"))
    assert labels[N + "gpu.machine"] == "Google-Compute-Engine"
    assert labels[N + "gpu.mode"] == "compute"


A100_BASE = {
    N + "gpu.machine": "unknown",
    **versions("535.183.01", "01", "12.2"),
    N + "mig.capable": "true",
    N + "mps.capable": "false",
    N + "gpu.product": "NVIDIA-A100-SXM4-40GB",
    N + "gpu.count": "8",
    N + "gpu.replicas": "1",
    N + "gpu.sharing-strategy": "none",
    N + "gpu.memory": "40960",
    N + "gpu.family": "ampere",
    N + "gpu.compute.major": "8",
    N + "gpu.compute.minor": "0",
    N + "gpu.mode": "unknown",
}


def test_a100_none() -> None:
    assert labels_for("a100-sxm-8") == A100_BASE


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a100_mig_strategy_without_mig_mode_adds_only_the_strategy(strategy: str) -> None:
    assert labels_for("a100-sxm-8", f"version: v1\nflags: {{migStrategy: {strategy}}}\n") == {
        **A100_BASE,
        N + "mig.strategy": strategy,
    }


def test_a100_time_slicing_and_mps() -> None:
    assert labels_for("a100-sxm-8", TS_4) == {
        **A100_BASE,
        N + "gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
        N + "gpu.replicas": "4",
        N + "gpu.sharing-strategy": "time-slicing",
    }
    assert labels_for("a100-sxm-8", MPS_10) == {
        **A100_BASE,
        N + "gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
        N + "gpu.replicas": "10",
        N + "gpu.sharing-strategy": "mps",
        N + "mps.capable": "true",
    }


H100_GPU = {
    N + "gpu.machine": "unknown",
    **versions("550.90.07", "07", "12.4"),
    N + "mig.capable": "true",
    N + "mps.capable": "false",
    N + "gpu.product": "NVIDIA-H100-80GB-HBM3",
    N + "gpu.count": "8",
    N + "gpu.replicas": "0",  # MIG-enabled GPUs: NVIDIA labels them with sharing disabled
    N + "gpu.sharing-strategy": "none",
    N + "gpu.memory": "81559",
    N + "gpu.family": "hopper",
    N + "gpu.compute.major": "9",
    N + "gpu.compute.minor": "0",
    N + "gpu.mode": "unknown",
}


def mig_set(key: str, product: str, count: int, memory: int, slices: int, replicas: int = 1,
            strategy: str = "none") -> dict[str, str]:  # fmt: skip
    return {
        f"{key}.product": product,
        f"{key}.count": str(count),
        f"{key}.replicas": str(replicas),
        f"{key}.sharing-strategy": strategy,
        f"{key}.memory": str(memory),
        f"{key}.multiprocessors": str(16 * slices),  # the stand-in NVML: 16 per slice
        f"{key}.slices.gi": str(slices),
        f"{key}.slices.ci": str(slices),
        f"{key}.engines.copy": "0",
        f"{key}.engines.decoder": "0",
        f"{key}.engines.encoder": "0",
        f"{key}.engines.jpeg": "0",
        f"{key}.engines.ofa": "0",
    }


def test_h100_mig_8_none_labels_whole_gpus_with_replicas_0() -> None:
    assert labels_for("h100-mig-8") == H100_GPU


def test_h100_mig_8_mixed() -> None:
    # GPU 0-7: 7x1g.10gb | 3x2g.20gb+1g.10gb | 2x3g.40gb | 7g.80gb | 3g.40gb+2g.20gb+1g.10gb+me+1g.10gb
    # | 4g.40gb+3g.40gb | 4x1g.20gb+3x1g.10gb | 7g.80gb
    h = "NVIDIA-H100-80GB-HBM3-MIG-"
    assert labels_for("h100-mig-8", "version: v1\nflags: {migStrategy: mixed}\n") == {
        **H100_GPU,
        N + "mig.strategy": "mixed",
        **mig_set(N + "mig-1g.10gb", h + "1g.10gb", 12, 9984, 1),
        **mig_set(N + "mig-1g.10gb.me", h + "1g.10gb.me", 1, 9984, 1),
        **mig_set(N + "mig-1g.20gb", h + "1g.20gb", 4, 20096, 1),
        **mig_set(N + "mig-2g.20gb", h + "2g.20gb", 4, 20096, 2),
        **mig_set(N + "mig-3g.40gb", h + "3g.40gb", 4, 40320, 3),
        **mig_set(N + "mig-4g.40gb", h + "4g.40gb", 1, 40320, 4),
        **mig_set(N + "mig-7g.80gb", h + "7g.80gb", 2, 80768, 7),
    }


def test_h100_mig_8_mixed_time_sliced_profile() -> None:
    text = """
version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    resources:
      - {name: nvidia.com/mig-3g.40gb, replicas: 2}
"""
    labels = labels_for("h100-mig-8", text)
    key = N + "mig-3g.40gb"
    assert labels[key + ".product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb-SHARED"
    assert labels[key + ".replicas"] == "2"
    assert labels[key + ".sharing-strategy"] == "time-slicing"
    assert labels[N + "mig-1g.10gb.replicas"] == "1"
    assert labels[N + "mig-1g.10gb.sharing-strategy"] == "none"
    assert labels[N + "gpu.replicas"] == "0"


def test_h100_mig_8_single_is_invalid() -> None:
    assert labels_for("h100-mig-8", "version: v1\nflags: {migStrategy: single}\n") == {
        **H100_GPU,
        N + "mig.strategy": "single",
        N + "gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-INVALID",
        N + "gpu.count": "0",
        N + "gpu.replicas": "0",
        N + "gpu.sharing-strategy": "",  # NVIDIA's invalid set writes it empty
        N + "gpu.memory": "0",
    }


H100_SINGLE = {
    **H100_GPU,
    N + "mig.strategy": "single",
    **mig_set(N + "gpu", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 56, 9984, 1),
}


def test_h100_mig_single() -> None:
    assert labels_for("h100-mig-single", "version: v1\nflags: {migStrategy: single}\n") == H100_SINGLE


def test_h100_mig_single_time_sliced() -> None:
    text = "version: v1\nflags: {migStrategy: single}\n" + TS_4.replace("version: v1\n", "")
    assert labels_for("h100-mig-single", text) == {
        **H100_SINGLE,
        N + "gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED",
        N + "gpu.replicas": "4",
        N + "gpu.sharing-strategy": "time-slicing",
    }


def test_h100_mig_single_under_mixed() -> None:
    assert labels_for("h100-mig-single", "version: v1\nflags: {migStrategy: mixed}\n") == {
        **H100_GPU,
        N + "mig.strategy": "mixed",
        **mig_set(N + "mig-1g.10gb", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 56, 9984, 1),
    }


H100_EMPTY = {
    **H100_GPU,
    N + "gpu.count": "2",
    N + "gpu.replicas": "1",  # GPU 1 has MIG off: whole-GPU labels win over MIG-enabled ones
}


def test_h100_mig_empty_none_and_mixed() -> None:
    assert labels_for("h100-mig-empty") == H100_EMPTY
    assert labels_for("h100-mig-empty", "version: v1\nflags: {migStrategy: mixed}\n") == {
        **H100_EMPTY,
        N + "mig.strategy": "mixed",
    }


def test_h100_mig_empty_single_is_invalid() -> None:
    assert labels_for("h100-mig-empty", "version: v1\nflags: {migStrategy: single}\n") == {
        **H100_EMPTY,
        N + "mig.strategy": "single",
        N + "gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-INVALID",
        N + "gpu.count": "0",
        N + "gpu.replicas": "0",
        N + "gpu.sharing-strategy": "",  # NVIDIA's invalid set writes it empty
        N + "gpu.memory": "0",
    }


def test_mps_with_mig_enabled_is_not_mps_capable() -> None:
    labels = labels_for("h100-mig-empty", MPS_10)
    assert labels[N + "mps.capable"] == "false"


MIXED_4 = {
    N + "gpu.machine": "unknown",
    **versions("535.161.08", "08", "12.2"),
    N + "mig.capable": "false",
    N + "mps.capable": "false",
    # Two models of two GPUs each: the tie goes to the model of the lowest GPU index.
    N + "gpu.product": "Tesla-T4",
    N + "gpu.count": "2",
    N + "gpu.replicas": "1",
    N + "gpu.sharing-strategy": "none",
    N + "gpu.memory": "15360",
    N + "gpu.family": "turing",
    N + "gpu.compute.major": "7",
    N + "gpu.compute.minor": "5",
    N + "gpu.mode": "unknown",
}


def test_mixed_4() -> None:
    assert labels_for("mixed-4") == MIXED_4


def test_mixed_4_time_slicing_and_mps() -> None:
    assert labels_for("mixed-4", TS_4) == {
        **MIXED_4,
        N + "gpu.product": "Tesla-T4-SHARED",
        N + "gpu.replicas": "4",
        N + "gpu.sharing-strategy": "time-slicing",
    }
    labels = labels_for("mixed-4", MPS_10)
    assert labels[N + "mps.capable"] == "true"
    assert labels[N + "gpu.sharing-strategy"] == "mps"


def test_mixed_4_shared_subset_follows_the_plan() -> None:
    # Only the V100s (GPU 2, 3) are shared, under their own name: the T4 labels stay unshared.
    text = """
version: v1
sharing:
  timeSlicing:
    resources:
      - {name: nvidia.com/gpu, rename: nvidia.com/v100, replicas: 3, devices: [2, 3]}
"""
    assert labels_for("mixed-4", text) == MIXED_4


def test_invalid_plan_is_labelled_unshared() -> None:
    # 100 MPS clients exceed a T4's 48: the plugin advertises nothing, so neither do the labels.
    labels = labels_for("t4", MPS_10.replace("replicas: 10", "replicas: 100"))
    assert labels == T4_BASE


def test_no_gpus_no_labels() -> None:
    empty = Inventory(driver_version="550.54.15", cuda_driver_version="12.4")
    assert gfd_labels(empty, None, "none") == {}


def test_bad_driver_version_is_an_error() -> None:
    inv = node("t4")
    bad = Inventory(driver_version="550", cuda_driver_version="12.4", gpus=inv.gpus)
    with pytest.raises(LabelError, match=r"X\.Y\[\.Z\]"):
        gfd_labels(bad, None, "none")


def test_timestamp() -> None:
    assert with_timestamp({"a": "b"}, 1724632719) == {"a": "b", N + "gfd.timestamp": "1724632719"}
    assert with_timestamp({"a": "b"}, None) == {"a": "b"}


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA  GeForce RTX 4090 (rev a1)", "NVIDIA-GeForce-RTX-4090-rev-a1"),
        ("  DGX-1 ", "DGX-1"),
        ("x" * 70, "x" * 63),
        ("(Tesla)", "Tesla"),
        ("A" * 62 + " B", "A" * 62),
    ],
)
def test_sanitise(raw: str, clean: str) -> None:
    assert sanitise(raw) == clean


@pytest.mark.parametrize(
    ("cc", "name"),
    [((1, 0), "tesla"), ((2, 1), "fermi"), ((3, 7), "kepler"), ((5, 2), "maxwell"), ((6, 0), "pascal"),
     ((7, 0), "volta"), ((7, 2), "volta"), ((7, 5), "turing"), ((8, 0), "ampere"), ((8, 6), "ampere"),
     ((8, 9), "ada-lovelace"), ((9, 0), "hopper"), ((10, 0), "blackwell"), ((12, 0), "blackwell"),
     ((13, 0), "rubin"), ((4, 0), "undefined")],
)  # fmt: skip
def test_family(cc: tuple[int, int], name: str) -> None:
    assert family(*cc) == name


def test_gpu_mode_from_pci_class() -> None:
    assert gpu_mode_from_pci_class("0x030200\n") == "compute"
    assert gpu_mode_from_pci_class("0x030000") == "graphics"
    assert gpu_mode_from_pci_class("0x068000") == "unknown"
