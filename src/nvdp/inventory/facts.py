"""NVIDIA's names for GPU facts, and the defaults a node profile derives for facts it leaves out.

Brand and architecture strings are the ones go-nvlib's GetBrandAsString / GetArchitectureAsString
return (what NVIDIA's DRA driver publishes); the keys are NVML's nvmlBrandType_t and
nvmlDeviceArchitecture_t values. The MIG defaults are documented in sim/nvml/README.md; the stand-in
NVML (sim/nvml/nvml_sim.c) derives the same values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

BRANDS: dict[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
ARCHITECTURES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    0xFFFFFFFF: "Unknown",
}
# go-nvlib's GetAddressingModeAsString names, keyed by nvmlDeviceAddressingModeType_t. Where the
# platform has no mode to report, NVML answers NOT_SUPPORTED instead.
ADDRESSING_MODES: dict[int, str] = {0: "None", 1: "HMM", 2: "ATS"}
# A100/H100-class GPUs split their memory into 8 slices; a GI placement counts in these.
MEMORY_SLICES = 8
# GPU instance profile ids as `nvidia-smi mig -lgip` lists them on A100/H100, by compute slices.
GI_PROFILE_IDS: dict[int, int] = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}
GI_PROFILE_1G_DOUBLE_MEMORY = 15  # 1g.20gb on H100 80GB, 1g.10gb on A100 40GB
GI_PROFILE_1G_MEDIA = 20  # 1g.10gb+me (and the other media-extension suffixes)

_MIG_SIZES = re.compile(r"^(?:\d+c\.)?(\d+)g\.(\d+)gb(.*)$")


def brand_name(value: int) -> str:
    """go-nvlib's string for an nvmlBrandType_t value ("Unknown" for values it does not know)."""
    return BRANDS.get(value, "Unknown")


def architecture_name(value: int) -> str:
    """go-nvlib's string for an nvmlDeviceArchitecture_t value ("Unknown" for values it does not know)."""
    return ARCHITECTURES.get(value, "Unknown")


def architecture_from_cc(cc: tuple[int, int]) -> str:
    """The architecture a CUDA compute capability belongs to (for NVML without nvmlDeviceGetArchitecture)."""
    major, minor = cc
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 8:
        return "Ada Lovelace" if minor == 9 else "Ampere"
    by_major = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 9: "Hopper", 10: "Blackwell", 11: "Blackwell",
                12: "Blackwell"}  # fmt: skip
    return by_major.get(major, "Unknown")


def default_brand(product_name: str) -> str:
    """The brand a profile without `brand` gets: Tesla for "Tesla ..." products, else Nvidia."""
    return "Tesla" if "Tesla" in product_name else "Nvidia"


def mig_memory_slices(profile: str, gpu_memory_mib: int) -> int | None:
    """Memory slices a MIG profile spans: its share of the GPU's memory in eighths (at least 1)."""
    m = _MIG_SIZES.match(profile)
    gpu_gb = (gpu_memory_mib + 512) // 1024
    if m is None or gpu_gb == 0:
        return None
    profile_gb = int(m.group(2))
    # rounded to the nearest eighth: 1g.10gb of 80 GB is 1, 1g.18gb of 141 GB is 1 too
    return max(1, (profile_gb * MEMORY_SLICES * 2 + gpu_gb) // (2 * gpu_gb))


def default_gi_profile_id(profile: str, gpu_memory_mib: int) -> int | None:
    """The GI profile id of a MIG profile by NVIDIA's A100/H100 numbering; None for unknown sizes."""
    m = _MIG_SIZES.match(profile)
    if m is None:
        return None
    slices, suffix = int(m.group(1)), m.group(3)
    if slices == 1 and suffix:
        return GI_PROFILE_1G_MEDIA
    if slices == 1 and (mig_memory_slices(profile, gpu_memory_mib) or 1) >= 2:
        return GI_PROFILE_1G_DOUBLE_MEMORY
    return GI_PROFILE_IDS.get(slices)


def pack_placements(sizes: Sequence[int], taken: Sequence[tuple[int, int]] = ()) -> list[int]:
    """Start slices for GPU instances of `sizes`, in order: each at the lowest start that is a multiple of
    its size and overlaps neither `taken` (start, size) nor the instances placed before it.

    A layout larger than the GPU (only made-up profiles have one) continues past the last memory slice,
    so the instances of one GPU never overlap.
    """
    used = [(s, s + n) for s, n in taken]
    starts: list[int] = []
    for size in sizes:
        start = 0
        while any(start < end and begin < start + size for begin, end in used):
            start += size
        used.append((start, start + size))
        starts.append(start)
    return starts
