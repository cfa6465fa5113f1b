"""The rules of the `nvdp` command line, held over every command of its argparse tree: a command
registered tomorrow fails here until it is placed in the tables below, and then follows them.

- A command that reads the plugin's config takes it as `--config` (`--config-file` too), reads
  exactly that file, and names `--config` when it cannot; a command that reads none never does.
- An option of a command before its action is taken after the action as well.
- A command that acts reports success only for what happened (`ACTING`, each with a case where it
  cannot act); the others only read and print (`READ_ONLY`).
- `nvdp plan` and `nvdp dra slices` print a table by default, `-o json|yaml` the same objects.
- Every help, the daemons' too, fits a screen (60 lines at 80 columns), the command's own options
  before the plugin's flags, and `--mig-strategy` names every strategy wherever it is taken.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from nvdp.cdi.build import SpecSet
from nvdp.cdi.spec import ContainerEdits, Device, DeviceNode, Spec
from nvdp.cli import build_parser, commands, main
from nvdp.config.loader import ConfigFileUnreadable
from nvdp.config.model import MigStrategy
from nvdp.doctor.report import Finding, failed
from nvdp.health.ledger import Cause, Ledger, Settings
from nvdp.health.state import write_state
from nvdp.health.xids import Remedy

PROFILES = Path(__file__).resolve().parent.parent / "sim" / "profiles"
Command = tuple[str, ...]


def _has_actions(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def leaves() -> dict[Command, argparse.ArgumentParser]:
    """Every command that runs: the parsers of the tree with no action below them."""
    return {path: parser for path, parser in commands(build_parser()) if path and not _has_actions(parser)}


def nvdp(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the config file -----------------------------------------------------------------------------

# Commands that read the plugin's config, with what else each needs to get as far as reading it.
CONFIG_READERS: dict[Command, tuple[str, ...]] = {
    ("config", "validate"): (),
    ("config", "show"): (),
    ("plan",): ("--node", "t4"),
    ("dra", "slices"): ("--node", "t4"),
    ("doctor",): (),
    ("cdi", "generate"): (),
}
# Commands that read no config, with arguments that run them here (None: they read the kubelet's
# sockets, not run here).
NO_CONFIG: dict[Command, Callable[[Path], tuple[str, ...]] | None] = {
    ("health", "show"): lambda tmp: ("--state-dir", str(tmp)),
    ("health", "clear"): lambda tmp: ("--all", "--state-dir", str(tmp)),
    ("usage",): None,
}


def test_every_command_says_whether_it_reads_a_config() -> None:
    assert set(leaves()) == set(CONFIG_READERS) | set(NO_CONFIG)
    assert not set(CONFIG_READERS) & set(NO_CONFIG)


@pytest.mark.parametrize("spelling", ["--config", "--config-file"])
@pytest.mark.parametrize("command", sorted(CONFIG_READERS), ids=" ".join)
def test_every_command_that_reads_a_config_takes_config(
    command: Command, spelling: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It reads the file given, and a file it cannot read is named as given by --config."""
    read: list[str] = []

    def unreadable(path: str, limit: int = 0) -> bytes:
        read.append(path)
        raise ConfigFileUnreadable("no such thing here")

    def findings(doctor: Any) -> list[Finding]:  # the doctor's report, without running its checks
        return [failed("config", "the config validates", doctor.config_error or "", "")]

    monkeypatch.setattr("nvdp.config.loader.read_config_file", unreadable)
    monkeypatch.setattr("nvdp.doctor.checks.Doctor.run", findings)
    monkeypatch.delenv("CONFIG_FILE", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    code, out, err = nvdp(capsys, *command, spelling, str(config), *CONFIG_READERS[command])
    assert read == [str(config)]
    assert code != 0
    assert "check the path given by --config" in out + err and "--config-file" not in out + err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", sorted(NO_CONFIG), ids=" ".join)
def test_commands_that_read_no_config_never_do(
    command: Command, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(path: str, limit: int = 0) -> bytes:
        raise AssertionError(f"{' '.join(command)} read the config file {path}")

    parser = leaves()[command]
    assert "--config" not in parser._option_string_actions
    arguments = NO_CONFIG[command]
    if arguments is None:
        return
    monkeypatch.setattr("nvdp.config.loader.read_config_file", refused)
    monkeypatch.setenv("CONFIG_FILE", str(tmp_path / "config.yaml"))
    code, _, err = nvdp(capsys, *command, *arguments(tmp_path))
    assert code == 0, err


# --- options before or after the action ----------------------------------------------------------

def _own_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.option_strings and a.nargs is None and not isinstance(a, (argparse._HelpAction,
                                                                           argparse._VersionAction))]


def test_an_option_before_the_action_is_taken_after_it_too() -> None:
    checked = 0
    for path, parser in commands(build_parser()):
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for option in _own_options(parser) if subparsers and path else []:
            flag = option.option_strings[0]
            for action in subparsers[0].choices:
                before = build_parser().parse_args([*path, flag, "/x", action])
                after = build_parser().parse_args([*path, action, flag, "/x"])
                assert getattr(before, option.dest) == getattr(after, option.dest) == "/x", \
                    (path, action, flag)
                checked += 1
    assert checked >= 2  # nvdp health --state-dir: show, clear


# --- success only for what happened --------------------------------------------------------------

READ_ONLY = {("config", "validate"), ("config", "show"), ("plan",), ("dra", "slices"), ("doctor",),
             ("health", "show"), ("usage",)}


def _clear_without_a_plugin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """No plugin takes the request: nothing is cleared, and it says so."""
    ledger = Ledger(Settings(after=60))
    ledger.fault("GPU-0", {"GPU-0"}, Cause("XID 95", Remedy.RESET, 95), 1_700_000_000.0)
    write_state(str(tmp_path), "nvidia-device-plugin", ledger.record(), 1_700_000_001.0)
    for argv in (["--all"], ["GPU-0"]):
        code, out, err = nvdp(capsys, "health", "clear", *argv, "--state-dir", str(tmp_path), "--wait", "0.1")
        assert (code, out) == (1, "")
        assert "nothing was cleared" in err
    assert os.listdir(tmp_path / "clear") == []


def _generate_where_nothing_can_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec that cannot be written fails; one already there is said to be unchanged, not written."""
    node = DeviceNode(path="/dev/nvidia0", host_path="/dev/nvidia0")
    device = Device(name="0", container_edits=ContainerEdits(device_nodes=(node,)))
    spec = Spec(cdi_version="0.5.0", kind="k8s.device-plugin.nvidia.com/gpu", devices=(device,),
                container_edits=ContainerEdits())
    monkeypatch.setattr("nvdp.cdi.cli.generate_specs", lambda args, env: SpecSet((spec,)))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = nvdp(capsys, "cdi", "generate", "--output", str(blocker / "spec.json"))
    assert (code, out) == (1, "") and "written" not in err
    target = tmp_path / "spec.json"
    assert nvdp(capsys, "cdi", "generate", "--output", str(target)) == (0, "", f"written: {target}\n")
    assert nvdp(capsys, "cdi", "generate", "--output", str(target)) == (0, "", f"unchanged: {target}\n")


# Commands that change something, each with a case where the change cannot happen.
ACTING: dict[Command, Callable[[Path, pytest.CaptureFixture[str], pytest.MonkeyPatch], None]] = {
    ("health", "clear"): _clear_without_a_plugin,
    ("cdi", "generate"): _generate_where_nothing_can_be_written,
}


def test_every_command_says_whether_it_acts() -> None:
    assert set(leaves()) == READ_ONLY | set(ACTING)
    assert not READ_ONLY & set(ACTING)


@pytest.mark.parametrize("command", sorted(ACTING), ids=" ".join)
def test_no_command_reports_success_without_effect(
    command: Command, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ACTING[command](tmp_path, capsys, monkeypatch)


# --- the previews print tables -------------------------------------------------------------------

PREVIEWS: set[Command] = {("plan",), ("dra", "slices")}
DRA_MODE = "version: v1\nflags:\n  mode: dra\n"


@pytest.mark.parametrize("command", sorted(PREVIEWS), ids=" ".join)
def test_previews_default_to_a_table(command: Command) -> None:
    parser = leaves()[command]
    output = parser._option_string_actions["-o"]
    assert output is parser._option_string_actions["--output"]
    assert (output.default, tuple(output.choices or ())) == ("table", ("table", "json", "yaml"))


def _documents(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[str], Any]:
    """The table's lines and the JSON document of one preview, the YAML one checked equal to it."""
    code, table, err = nvdp(capsys, *argv)
    assert code == 0, err
    code, printed, _ = nvdp(capsys, *argv, "-o", "json")
    assert code == 0
    document = json.loads(printed)
    code, printed, _ = nvdp(capsys, *argv, "-o", "yaml")
    assert code == 0 and yaml.safe_load(printed) == document
    return table.splitlines(), document


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES.glob("*.yaml")))
def test_the_slices_table_shows_the_devices_of_the_slices(profile: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    lines, slices = _documents(capsys, "dra", "slices", "--node", profile)
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert lines[0].startswith(f"Node: {PROFILES / profile}.yaml (")
    if not devices:
        return
    header = lines.index(next(line for line in lines if line.startswith("DEVICE ")))
    rows = lines[header + 1:]
    assert [row.split()[0] for row in rows] == [d["name"] for d in devices]
    assert [row.split()[1] for row in rows] == [d["attributes"]["type"]["string"] for d in devices]


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES.glob("*.yaml")))
def test_the_plan_table_shows_the_resources_of_the_plan(profile: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = nvdp(capsys, "plan", "--node", profile)
    if code != 0:  # a profile the default config cannot serve (a MIG GPU without devices): said in one line
        assert code == 2 and err.count("\n") == 1
        return
    lines, plan = _documents(capsys, "plan", "--node", profile)
    resources = [(r["name"], str(r["count"])) for r in plan["resources"]]
    rows = [tuple(line.split()[:2]) for line in lines if line.startswith("nvidia.com/")]
    assert rows == resources
    assert (plan["mode"], "No resources would be advertised." in lines) == ("device-plugin", not resources)


def test_plan_in_dra_mode_shows_the_devices_the_dra_plugin_publishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "dra.yaml"
    config.write_text(DRA_MODE)
    lines, plan = _documents(capsys, "plan", "--node", "a100-sxm-8", "--config", str(config))
    _, slices = _documents(capsys, "dra", "slices", "--node", "a100-sxm-8", "--config", str(config),
                           "--node-name", "a100-sxm-8")
    assert plan["mode"] == "dra" and plan["resources"] == [] and plan["slices"] == slices
    assert "No resources would be advertised." not in lines
    assert any("`nvdp dra slices`" in line for line in lines)
    assert [line.split()[0] for line in lines if line.startswith("gpu-")] == [
        d["name"] for d in slices[0]["spec"]["devices"]]


@pytest.mark.parametrize("command", sorted(PREVIEWS), ids=" ".join)
def test_without_a_profile_or_nvml_the_preview_asks_for_one(
    command: Command, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvdp.daemon.errors import NvmlMissing

    def no_nvml(config: object) -> None:
        raise NvmlMissing("NVML is not available (ERROR_LIBRARY_NOT_FOUND): not here. Fix: elsewhere")

    monkeypatch.setattr("nvdp.daemon.inputs.discover", no_nvml)
    code, out, err = nvdp(capsys, *command)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "NVML is not available (ERROR_LIBRARY_NOT_FOUND)" in err
    assert "pass --node PROFILE" in err


# --- help that fits a screen ---------------------------------------------------------------------

def daemon_parsers() -> dict[str, argparse.ArgumentParser]:
    from nvdp.dra.main import build_parser as dra_parser
    from nvdp.gfd.options import parser as gfd_parser
    from nvdp.mps.main import build_parser as mps_parser
    from nvdp.plugin.main import build_parser as plugin_parser

    return {"nvidia-device-plugin": plugin_parser({}), "nvidia-dra-plugin": dra_parser({}),
            "mps-control-daemon": mps_parser(), "gpu-feature-discovery": gfd_parser()}


def every_parser() -> dict[str, argparse.ArgumentParser]:
    found = {" ".join(("nvdp", *path)): parser for path, parser in commands(build_parser())}
    return {**found, **daemon_parsers()}


@pytest.mark.parametrize("columns", [80, 100])
def test_every_help_fits_a_screen(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    for name, parser in every_parser().items():
        lines = parser.format_help().splitlines()
        assert len(lines) <= 60, f"{name} --help: {len(lines)} lines at {columns} columns"
        assert max(len(line) for line in lines) <= columns, name


def test_the_commands_own_options_come_before_the_plugins_flags() -> None:
    """The plugin's flags, where a program takes them without describing each, are its last group."""
    for name, parser in every_parser().items():
        action = parser._option_string_actions.get("--mig-strategy")
        if action is None or action.help != argparse.SUPPRESS:
            continue
        last = parser._action_groups[-1]
        assert action in last._group_actions, name
        assert "nvidia-device-plugin --help" in (last.description or ""), name


def test_mig_strategy_names_every_strategy_wherever_it_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    for name, parser in every_parser().items():
        action = parser._option_string_actions.get("--mig-strategy")
        if action is None:
            continue
        if action.choices is not None:
            assert set(action.choices) == set(get_args(MigStrategy)), name
        shown = parser.format_help()
        assert "dynamic" in shown, name
