"""`nvdp plan`: the table, -o json|yaml, and exit 2 with a one-line error for bad input."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import yaml
from plan_factories import gpu_uuid, mig_uuid

from nvdp.cli import plan as cli
from nvdp.inventory.profile import resolve_profile


def profile_doc(
    gpus: int = 1, name: str = "Tesla T4", mig: list[list[str] | None] | None = None
) -> dict[str, object]:
    """A node profile document; `mig[i]` lists the MIG profiles of GPU i (MIG enabled when given)."""
    out = []
    for i in range(gpus):
        profiles = mig[i] if mig is not None else None
        g: dict[str, object] = {
            "index": i,
            "uuid": gpu_uuid(i),
            "name": name,
            "memory_mib": 15360,
            "compute_capability": "7.5",
            "minor": i,
            "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
            "numa_node": 0,
        }
        if profiles is not None:
            g.update(mig_capable=True, mig_enabled=True)
            g["mig_devices"] = [
                {"uuid": mig_uuid(i, j), "profile": p, "gi_id": j + 1, "ci_id": 0, "memory_mib": 9856}
                for j, p in enumerate(profiles)
            ]
        out.append(g)
    return {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": out}


def write_profile(tmp_path: Path, doc: dict[str, object], name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="nvdp")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_table_for_defaults_on_two_t4s(tmp_path: Path) -> None:
    path = write_profile(tmp_path, profile_doc(gpus=2))
    code, out, err = run("--node", str(path))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"Node: {path} (2 GPUs, driver 550.54.15)",
        "Config: defaults (migStrategy none)",
        "",
        "RESOURCE        COUNT  DEVICES  GPUS          SHARING",
        "nvidia.com/gpu  2      2        0-1 Tesla T4  none",
    ]


def test_table_for_mixed_lists_mig_resources_and_exclusions(tmp_path: Path) -> None:
    doc = profile_doc(gpus=2, name="NVIDIA A100-SXM4-40GB", mig=[["1g.5gb", "1g.5gb", "3g.20gb"], []])
    path = write_profile(tmp_path, doc)
    code, out, _ = run("--node", str(path), "--mig-strategy", "mixed")
    assert code == 0
    assert out.splitlines()[1:] == [
        "Config: defaults (migStrategy mixed)",
        "",
        "RESOURCE                COUNT  DEVICES  GPUS                     SHARING",
        "nvidia.com/mig-1g.5gb   2      2        0 NVIDIA A100-SXM4-40GB  none",
        "nvidia.com/mig-3g.20gb  1      1        0 NVIDIA A100-SXM4-40GB  none",
        "",
        "Excluded devices:",
        f"  - {gpu_uuid(1)}: MIG mode is enabled but no MIG devices are configured; create MIG devices "
        "on it (for example `nvidia-smi mig -i 1 -cgi <profile> -C`, or a mig-parted config) or disable "
        "MIG mode (`nvidia-smi -i 1 -mig 0`)",
    ]


def test_json_carries_resources_devices_warnings_and_exclusions(tmp_path: Path) -> None:
    doc = profile_doc(gpus=2, name="NVIDIA H100 80GB HBM3", mig=[["1g.10gb"], None])
    path = write_profile(tmp_path, doc)
    code, out, err = run("--node", str(path), "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["config"], data["node"], data["mig_strategy"]) == ("defaults", str(path), "none")
    assert [(r["name"], r["count"], r["gpus"], r["sharing"], r["replicas"]) for r in data["resources"]] == [
        ("nvidia.com/gpu", 2, "0-1 NVIDIA H100 80GB HBM3", "none", 1)
    ]
    first = data["resources"][0]["devices"][0]
    assert first == {
        "id": gpu_uuid(0),
        "base_id": gpu_uuid(0),
        "index": "0",
        "gpu_uuids": [gpu_uuid(0)],
        "gpu_indices": [0],
        "minors": [0],
        "numa_node": 0,
        "memory_bytes": 15360 * 1024 * 1024,
        "replica": None,
        "mig": None,
        "healthy": True,
    }
    assert len(data["warnings"]) == 1 and data["warnings"][0].startswith("MIG mode is enabled on GPU 0; ")
    assert data["excluded"] == []


def test_no_resources_is_said_in_words(tmp_path: Path) -> None:
    path = write_profile(tmp_path, {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": []})
    code, out, _ = run("--node", str(path))
    assert code == 0
    assert out.splitlines()[0] == f"Node: {path} (0 GPUs, driver 550.54.15)"
    assert out.splitlines()[3:] == ["No resources would be advertised."]


def test_plan_error_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write_profile(tmp_path, profile_doc(gpus=1, mig=[[]]))
    code, out, err = run("--node", str(path), "--mig-strategy", "single")
    assert (code, out) == (2, "")
    assert err.startswith("nvdp plan: error: invalid MIG configuration: at least one device with ")
    assert err.endswith("or disable MIG mode (`nvidia-smi -i 0 -mig 0`)\n")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_profile_exits_2(tmp_path: Path) -> None:
    code, out, err = run("--node", str(tmp_path / "nope.yaml"))
    assert (code, out) == (2, "")
    missing = tmp_path / "nope.yaml"
    assert err == (f"nvdp plan: error: --node: no node profile '{missing}'; give a profile file or the name "
                   "of one in sim/profiles (e.g. t4, a100-sxm-8, h100-mig-8)\n")


def test_invalid_profile_exits_2(tmp_path: Path) -> None:
    path = write_profile(tmp_path, {"driver_version": "550.54.15", "cuda_driver_version": "12", "gpus": []})
    code, _, err = run("--node", str(path))
    assert code == 2
    assert err == (
        f'nvdp plan: error: --node: node profile {path}: cuda_driver_version: expected "major.minor" like '
        "\"12.4\", got '12'; correct the profile\n"
    )


def test_profile_name_resolves_under_sim_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sim" / "profiles").mkdir(parents=True)
    write_profile(tmp_path / "sim" / "profiles", profile_doc(gpus=3), "three-t4.yaml")
    monkeypatch.chdir(tmp_path)
    assert resolve_profile("three-t4") == tmp_path / "sim" / "profiles" / "three-t4.yaml"
    code, out, _ = run("--node", "three-t4")
    assert code == 0
    assert "nvidia.com/gpu  3      3        0-2 Tesla T4  none" in out.splitlines()


def test_resolve_profile_keeps_paths_as_given() -> None:
    assert resolve_profile("some/dir/t4") == Path("some/dir/t4")
    assert resolve_profile("t4.yaml") == Path("t4.yaml")
