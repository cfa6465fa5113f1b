"""flags.migDynamicProfiles: a node under dynamic MIG publishes the placements of the profiles it offers,
with the whole GPU and the GPU's counters as without the list; a name its GPUs lack is refused with the
valid ones, by the plugin and the preview alike."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from nvdp.config.loader import load_config
from nvdp.dra.pool.contents import pool_devices, pool_warnings
from nvdp.dra.pool.slices import desired_slices
from nvdp.plan import PlanError
from tests.dra.test_partitions import _fits, h100, node

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"


def offering(*profiles: str) -> Any:
    return load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra",
                                  "flags.migDynamicProfiles": list(profiles)})


def test_an_h100_offering_two_profiles_publishes_their_placements_and_the_whole_gpu() -> None:
    devices = pool_devices(offering("1g.10gb", "3g.40gb"), node(h100()))
    assert len(devices) == 10  # 7 + 2 placements and the whole GPU, not 26
    assert Counter(d.placement.profile if d.placement else "whole" for d in devices) == {
        "1g.10gb": 7, "3g.40gb": 2, "whole": 1}
    everything = {d.name: d for d in pool_devices(load_config(None, {}, {
        "flags.migStrategy": "dynamic", "flags.mode": "dra"}), node(h100()))}
    for device in devices:
        # The same devices as without the list, counters and all: the counters are the GPU's capacity.
        assert device == everything[device.name]
    assert devices[0].name == "gpu-0" and devices[0].consumes == dict(devices[0].counter_set.counters)  # type: ignore[union-attr]
    assert "profile-20-instances" in devices[0].counter_set.counters  # type: ignore[union-attr]
    # The scheduler still allocates only what NVML can make: 3g.40gb at 0 and four 1g.10gb after it.
    by_name = {d.name: d for d in devices}
    fits = [by_name["gpu-0-mig-3g40gb-9-0"], *(by_name[f"gpu-0-mig-1g10gb-19-{i}"] for i in range(4, 7))]
    assert _fits(fits) and not _fits([*fits, by_name["gpu-0-mig-1g10gb-19-3"]])
    assert not _fits([by_name["gpu-0-mig-3g40gb-9-0"], by_name["gpu-0"]])


def test_a_single_placement_is_offered_by_its_first_memory_slice() -> None:
    names = [d.name for d in pool_devices(offering("3g.40gb@4", "7g.80gb"), node(h100(0), h100(1)))]
    assert names == ["gpu-0", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-7g80gb-0-0",
                     "gpu-1", "gpu-1-mig-3g40gb-9-4", "gpu-1-mig-7g80gb-0-0"]


def test_eight_h100s_offering_two_profiles_publish_80_devices_in_three_slices() -> None:
    inventory = node(*(h100(i) for i in range(8)))
    slices = desired_slices(node="node-a", node_uid="uid", driver="gpu.nvidia.com",
                            devices=pool_devices(offering("1g.10gb", "3g.40gb"), inventory))
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    sets = [c for s in slices for c in s["spec"].get("sharedCounters", [])]
    assert len(devices) == 80 and len(sets) == 8
    assert len(slices) == 3  # one counter slice, two device slices of at most 64


def test_a_profile_the_gpus_lack_is_refused_with_the_valid_names() -> None:
    with pytest.raises(PlanError) as caught:
        pool_devices(offering("1g.10gb", "2g.10gb", "3G.40GB"), node(h100()))
    text = str(caught.value)
    assert text.startswith("flags.migDynamicProfiles: ")
    assert "2g.10gb is not a MIG profile of this node's GPUs" in text
    assert "3G.40GB is not a MIG profile of this node's GPUs (did you mean 3g.40gb?)" in text
    assert text.endswith("the profiles of this node's MIG-capable GPUs are 1g.10gb, 1g.10gb+me, 1g.20gb, "
                         "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb")


def test_a_placement_the_profile_lacks_is_refused_with_its_starts() -> None:
    with pytest.raises(PlanError, match=r"3g\.40gb@2: no 3g\.40gb placement starts at memory slice 2 "
                                        r"\(they start at 0, 4\)"):
        pool_devices(offering("3g.40gb@2"), node(h100()))


def test_a_node_without_mig_capable_gpus_takes_the_list_as_it_is() -> None:
    t4 = replace(h100(), mig_capable=False, mig_enabled=False, mig_profiles=(), name="Tesla T4")
    assert [d.name for d in pool_devices(offering("1g.10gb"), node(t4))] == ["gpu-0"]


def test_a_gpu_offering_none_of_the_listed_profiles_is_published_whole_with_a_warning() -> None:
    # A node of two GPU models: the list names the first one's profile only.
    other = replace(h100(1), mig_profiles=tuple(replace(p, name=p.name.replace("gb", "GB"))
                                                 for p in h100().mig_profiles))
    config = offering("1g.10gb")
    names = [d.name for d in pool_devices(config, node(h100(0), other))]
    assert names == ["gpu-0", *(f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)), "gpu-1"]
    (warning,) = pool_warnings(config, node(h100(0), other), "dra", default_is="", default_fix="")
    assert warning.startswith("GPU 1 (")
    assert "none of the MIG profiles flags.migDynamicProfiles offers" in warning


def test_the_doctor_counts_the_list_too(tmp_path: Path) -> None:
    from nvdp.doctor.dra_check import DraNode, dynamic_mig

    plugin = DraNode("gpu.nvidia.com", str(tmp_path / "r.sock"), str(tmp_path / "p" / "dra.sock"), True, "")
    other = replace(h100(1), mig_profiles=tuple(replace(p, name=p.name.upper()) for p in h100().mig_profiles))
    found = dynamic_mig(node(h100(0), other), plugin, offering("1g.10gb"))
    assert found.status == "FAIL" and "GPU 1 (" in found.detail


def test_the_preview_refuses_a_missing_profile_as_the_plugin_does(tmp_path: Path) -> None:
    from tests.dra.test_cli import run

    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: dynamic\n  mode: dra\n"
                      "  migDynamicProfiles: [1g.10gb, 3g.45gb]\n")
    code, out, err = run("--node", "h100-mig-dynamic", "--config", str(config))
    assert code == 2 and out == ""
    assert "3g.45gb is not a MIG profile of this node's GPUs (did you mean 3g.40gb?)" in err
    config.write_text(config.read_text().replace("3g.45gb", "3g.40gb"))
    code, out, _ = run("--node", "h100-mig-dynamic", "--config", str(config))
    devices = [d["name"] for s in json.loads(out) for d in s["spec"].get("devices", [])]
    assert code == 0 and len(devices) == 10
