"""`nvdp config validate` and `nvdp config show`: exit codes, summaries, every error listed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvdp.cli import main
from nvdp.config.loader import load_config_text
from nvdp.config.model import Config

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_validate_seed_004(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(HERE / "valid" / "seed-004-mps.yaml")
    assert main(["config", "validate", path]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: valid (v1; sharing: mps, 1 resource: nvidia.com/gpu x10)\n"
    assert err == ""


@pytest.mark.parametrize(
    ("name", "summary"),
    [
        ("empty.yaml", "v1; sharing: none"),
        ("mode-dra.yaml", "v1; mode: dra; sharing: none"),
        (
            "time-slicing-rename-by-default.yaml",
            "v1; sharing: time-slicing, 1 resource: nvidia.com/gpu x4 as nvidia.com/gpu.shared",
        ),
        (
            "time-slicing-mig-mixed.yaml",
            "v1; migStrategy: mixed; sharing: time-slicing, 5 resources: nvidia.com/gpu x2, "
            "nvidia.com/mig-1g.5gb x2, nvidia.com/mig-2g.10gb x2, "
            "nvidia.com/mig-3g.20gb x3, nvidia.com/mig-7g.40gb x7",
        ),
    ],
)
def test_validate_summaries(name: str, summary: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(HERE / "valid" / name)
    assert main(["config", "validate", path]) == 0
    assert capsys.readouterr().out == f"{path}: valid ({summary})\n"


def test_validate_lists_every_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        "version: v1\nflags:\n  renameByDefault: true\nsharing:\n  mps:\n    resources:\n"
        "    - name: gpu\n      replicas: 0\n",
    )
    assert main(["config", "validate", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}:3: flags.renameByDefault: unknown key; did you mean sharing.timeSlicing.renameByDefault?",
        f"{path}:8: sharing.mps.resources[0].replicas: must be at least 1 (got 0); "
        "expected an integer from 1 to 1024",
        f"{path}: invalid (2 problems)",
    ]


def test_validate_ignores_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MIG_STRATEGY", "bogus")
    assert main(["config", "validate", str(HERE / "valid" / "time-slicing.yaml")]) == 0


@pytest.mark.parametrize("argv", [["--config", "/nonexistent.yaml"], ["/nonexistent.yaml"],
                                  ["--config-file", "/nonexistent.yaml"]])
def test_validate_missing_file(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--config, or its older spellings FILE and --config-file; the message names --config."""
    assert main(["config", "validate", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "/nonexistent.yaml: (document): cannot read the config file: No such file or directory; "
        "check the path given by --config",
        "/nonexistent.yaml: invalid (1 problem)",
    ]


def test_validate_needs_one_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONFIG_FILE", raising=False)
    assert main(["config", "validate"]) == 2
    assert capsys.readouterr().err == \
        "nvdp config validate: name the file to check: --config FILE (or set CONFIG_FILE)\n"
    monkeypatch.setenv("CONFIG_FILE", write(tmp_path, "version: v1\n", "pod.yaml"))  # as in the plugin's pod
    assert main(["config", "validate"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'pod.yaml'}: valid (v1; sharing: none)\n"
    one, other = write(tmp_path, "version: v1\n", "a.yaml"), write(tmp_path, "version: v1\n", "b.yaml")
    assert main(["config", "validate", one, "--config", other]) == 2
    assert "name two files; give one, as --config FILE" in capsys.readouterr().err
    assert main(["config", "validate", one, "--config", one]) == 0


def test_show_applies_env_and_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("CONFIG_FILE", "MIG_STRATEGY", "DEVICE_LIST_STRATEGY", "MPS_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MIG_STRATEGY", "single")
    monkeypatch.setenv("DEVICE_LIST_STRATEGY", "envvar,cdi-cri")
    path = str(HERE / "valid" / "seed-004-mps.yaml")
    assert main(["config", "show", path, "--mps-root=/srv/mps", "--pass-device-specs"]) == 0
    out = capsys.readouterr().out
    doc = yaml.safe_load(out)
    assert doc["flags"]["migStrategy"] == "single"
    assert doc["flags"]["mpsRoot"] == "/srv/mps"
    assert doc["flags"]["plugin"]["passDeviceSpecs"] is True
    assert doc["flags"]["plugin"]["deviceListStrategy"] == ["envvar", "cdi-cri"]
    assert doc["sharing"] == {
        "mps": {
            "renameByDefault": False,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "devices": "all", "replicas": 10,
                           "strictShares": False}],
        }
    }
    # What `show` prints loads back as the same configuration.
    again = load_config_text(out, "shown.yaml", env={})
    assert again.flags.mps_root == "/srv/mps"
    assert (
        again.sharing == load_config_text((HERE / "valid" / "seed-004-mps.yaml").read_bytes(), env={}).sharing
    )


def test_show_without_a_file_prints_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("CONFIG_FILE", "MIG_STRATEGY", "MPS_ROOT", "DEVICE_LIST_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["config", "show"]) == 0
    assert load_config_text(capsys.readouterr().out, "shown.yaml", env={}) == Config(source="shown.yaml")


def test_show_reports_env_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CONFIG_FILE", raising=False)
    monkeypatch.setenv("FAIL_ON_INIT_ERROR", "sometimes")
    assert main(["config", "show", "--mig-strategy=many"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "FAIL_ON_INIT_ERROR: flags.failOnInitError: not a boolean (got 'sometimes'); "
        "use true/false, 1/0 or yes/no",
        "--mig-strategy: flags.migStrategy: is not an allowed value (got 'many'); "
        "expected one of none, single, mixed, dynamic",
        "configuration: invalid (2 problems)",
    ]


@pytest.mark.slow
def test_cli_never_shows_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "\x00\xff not yaml", "bad.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "config", "validate", path],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"{path}: invalid (1 problem)"
