"""MIG profiles in node profiles: mig_profiles per GPU (shared through mig_profile_sets and YAML anchors)
read into Gpu.mig_profiles, and the errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvdp.inventory.model import MigProfile
from nvdp.inventory.profile import ProfileError, inventory_from_profile, load_profile
from sim.nvml import PROFILES_DIR

ONE_G: dict[str, Any] = {
    "name": "1g.10gb", "profile_index": 0, "gi_profile_id": 19, "slices": 1, "instances": 7,
    "memory_mib": 9984, "multiprocessors": 16, "copy_engines": 1, "decoders": 1, "encoders": 0,
    "jpeg_engines": 1, "ofa_engines": 0, "placements": [[0, 1], [1, 1]],
}  # fmt: skip
FIELDS = (
    "copy_engines, decoders, encoders, gi_profile_id, instances, jpeg_engines, memory_mib, multiprocessors, "
    "name, ofa_engines, placements, profile_index, slices"
)


def doc(profiles: object, **gpu: Any) -> dict[str, Any]:
    base = {
        "index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559, "compute_capability": "9.0", "minor": 0, "pci_bus_id": "00000000:3B:00.0",
        "mig_capable": True, "mig_profiles": profiles, **gpu,
    }  # fmt: skip
    return {"driver_version": "580.159.04", "cuda_driver_version": "13.0", "gpus": [base]}


def error(document: Any) -> str:
    with pytest.raises(ProfileError) as err:
        inventory_from_profile(document)
    return str(err.value)


def test_mig_profiles_are_read_with_their_placements() -> None:
    (gpu,) = inventory_from_profile(doc([ONE_G])).gpus
    assert gpu.mig_profiles == (
        MigProfile(name="1g.10gb", profile_index=0, gi_profile_id=19, slices=1, instances=7, memory_mib=9984,
                   multiprocessors=16, copy_engines=1, decoders=1, encoders=0, jpeg_engines=1, ofa_engines=0,
                   placements=((0, 1), (1, 1))),
    )  # fmt: skip


def test_a_profile_set_is_shared_through_a_yaml_anchor(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    gpu = ("  - {{index: {i}, uuid: GPU-{i}1111111-2222-3333-4444-555555555555, name: NVIDIA H100 80GB HBM3, "
           "memory_mib: 81559, compute_capability: '9.0', minor: {i}, pci_bus_id: '00000000:3{i}:00.0', "
           "mig_capable: true, mig_profiles: *h100}}\n")  # fmt: skip
    path.write_text(
        'driver_version: "580.159.04"\ncuda_driver_version: "13.0"\nmig_profile_sets:\n'
        "  h100: &h100\n    - {name: 7g.80gb, profile_index: 4, gi_profile_id: 0, slices: 7, instances: 1, "
        "memory_mib: 81152, multiprocessors: 132, copy_engines: 8, decoders: 7, encoders: 0, "
        "jpeg_engines: 7, ofa_engines: 1, placements: [[0, 8]]}\ngpus:\n" + gpu.format(i=0) + gpu.format(i=1)
    )
    first, second = load_profile(path).gpus
    assert first.mig_profiles == second.mig_profiles
    assert [(p.name, p.placements) for p in first.mig_profiles] == [("7g.80gb", ((0, 8),))]


def test_shipped_mig_capable_gpus_have_their_profiles() -> None:
    eighty = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"]
    forty = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"]
    for name, expected in [("h100-mig-dynamic", eighty), ("h100-mig-8", eighty), ("a100-sxm-8", forty),
                           ("a100-80gb-mig-dynamic", eighty)]:
        for gpu in load_profile(PROFILES_DIR / f"{name}.yaml").gpus:
            assert [p.name for p in gpu.mig_profiles] == expected, name
            assert [p.gi_profile_id for p in gpu.mig_profiles] == [19, 14, 9, 5, 0, 20, 15], name
    t4 = load_profile(PROFILES_DIR / "t4.yaml").gpus[0]
    assert t4.mig_profiles == ()


@pytest.mark.parametrize(
    ("profiles", "gpu", "message"),
    [
        ([ONE_G], {"mig_capable": False},
         "gpus[0].mig_profiles: listed, but mig_capable is not true (only a MIG-capable GPU has them)"),
        ({"1g.10gb": ONE_G}, {}, "gpus[0].mig_profiles: expected a list of MIG profiles, got dict"),
        ([{**ONE_G, "placements": [[7, 2]]}], {},
         "gpus[0].mig_profiles[0].placements[0]: expected [start, size] with start + size <= 8 and size > 0 "
         "(a list of [start, size] pairs within the GPU's 8 memory slices), got [7, 2]"),
        ([{**ONE_G, "placements": [[0, 0]]}], {},
         "gpus[0].mig_profiles[0].placements[0]: expected [start, size] with start + size <= 8 and size > 0 "
         "(a list of [start, size] pairs within the GPU's 8 memory slices), got [0, 0]"),
        ([{**ONE_G, "placements": []}], {},
         "gpus[0].mig_profiles[0].placements: expected a list of [start, size] pairs within the GPU's 8 "
         "memory slices, got list"),
        ([{k: v for k, v in ONE_G.items() if k != "ofa_engines"}], {},
         "gpus[0].mig_profiles[0].ofa_engines: required (fields: " + FIELDS + ")"),
        ([{**ONE_G, "profile_index": 17}], {},
         "gpus[0].mig_profiles[0].profile_index: NVML's profile indices are 0..16, got 17"),
        ([{**ONE_G, "slices": 8}], {}, "gpus[0].mig_profiles[0].slices: a GPU has 7 compute slices, got 8"),
        ([{**ONE_G, "name": "one-g"}], {},
         "gpus[0].mig_profiles[0].name: expected a MIG profile like '1g.10gb' or '1g.10gb+me', got 'one-g'"),
        ([{**ONE_G, "instances": -1}], {},
         "gpus[0].mig_profiles[0].instances: required, expected a non-negative integer, got -1"),
        ([ONE_G, {**ONE_G, "profile_index": 7, "name": "1g.10gb+me"}], {},
         "gpus[0].mig_profiles[1].gi_profile_id: 19 is listed twice; each profile once"),
        ([{**ONE_G, "sms": 16}], {},
         "gpus[0].mig_profiles[0]: unknown field 'sms' (known fields: " + FIELDS + ")"),
    ],
)  # fmt: skip
def test_mig_profile_errors_name_the_field(profiles: object, gpu: dict[str, Any], message: str) -> None:
    assert error(doc(profiles, **gpu)) == message


def test_profile_sets_must_be_a_mapping() -> None:
    document = {**doc([ONE_G]), "mig_profile_sets": [ONE_G]}
    assert error(document) == (
        "mig_profile_sets: expected a mapping of names to lists of MIG profiles (referred to with YAML "
        "anchors), got list"
    )
