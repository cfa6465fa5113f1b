"""`nvdp dra slices`: the ResourceSlices of a node profile (a table, or -o json); bad input is one line and
exit status 2."""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest

from nvdp.dra import cli
from nvdp.dra.pool.contents import DEFAULT_MODE_ENV
from nvdp.inventory.profile import load_profile
from sim.nvml import PROFILES_DIR


def run(*argv: str, output: str = "json") -> tuple[int, str, str]:
    """`nvdp dra slices ARGV -o OUTPUT`."""
    argv = (*argv, "-o", output)
    parser = argparse.ArgumentParser(prog="nvdp")
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["dra", "slices", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_prints_the_slices_of_a_profile() -> None:
    code, out, err = run("--node", "h100-mig-8", "--node-name", "gpu-node-1")
    assert code == 0 and err == ""
    (obj,) = json.loads(out)
    assert obj["metadata"]["name"] == "gpu-node-1-gpu.nvidia.com-0"
    assert obj["spec"]["nodeName"] == "gpu-node-1" and obj["spec"]["pool"]["name"] == "gpu-node-1"
    assert obj["spec"]["devices"][0]["name"] == "gpu-0-mig-1g10gb-19-0"
    kubernetes_validate.validate(obj, "1.36", strict=True)


def test_defaults_node_name_from_profile_and_takes_a_driver_and_a_path() -> None:
    code, out, _ = run("--node", str(PROFILES_DIR / "t4.yaml"), "--driver", "gpu.example.com")
    assert code == 0
    (obj,) = json.loads(out)
    assert obj["metadata"]["name"] == "t4-gpu.example.com-0"
    assert obj["spec"]["driver"] == "gpu.example.com"


def test_a_valid_config_is_accepted(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    code, _, err = run("--node", "t4", "--config", str(config))
    assert code == 0, err


@pytest.mark.parametrize(
    ("argv", "cause"),
    [
        (["--node", "no-such-profile"], "--node: no node profile 'no-such-profile'"),
        (["--node", "t4", "--driver", "d" * 27], "--driver: the DRA driver name"),
        (["--node", "t4", "--driver", "Bad_Driver"], "not a lower-case DNS subdomain"),
        (["--node", "t4", "--node-name", "Node_1"], "--node-name: 'Node_1' is not a node name"),
        (["--node", "t4", "--config", "/no/such/config.yaml"], "--config: /no/such/config.yaml"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], cause: str) -> None:
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("nvdp dra slices: error: ")
    assert cause in err
    assert "Traceback" not in err


def test_bad_config_and_bad_profile_files(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sideways\n")
    code, _, err = run("--node", "t4", "--config", str(config))
    assert code == 2 and "migStrategy" in err and err.count("\n") == 1
    profile = tmp_path / "bad.yaml"
    profile.write_text("driver_version: '1'\ncuda_driver_version: '12.4'\ngpus: 3\n")
    code, _, err = run("--node", str(profile))
    assert code == 2 and "gpus: expected a list" in err and err.count("\n") == 1


# --- the preview is what the plugin publishes ----------------------------------------------------

PROFILES = sorted(PROFILES_DIR.glob("*.yaml"))
VALID_CONFIGS = sorted((Path(__file__).parents[1] / "config" / "valid").iterdir())
NODE = "node-1"


class _ApiServerSlices:
    """The slices the DRA plugin's SlicePublisher writes, kept by name (the API calls it makes are
    replaced; what it computes and decides to write is its own)."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}

    def find(self, client: object, *, node: str, driver: str) -> list[dict[str, Any]]:
        return [obj for obj in self.slices.values()
                if obj["spec"]["nodeName"] == node and obj["spec"]["driver"] == driver]

    def write(self, client: object, obj: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(len(self.slices) + 1)
        self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def delete(self, client: object, name: str) -> None:
        self.slices.pop(name, None)

    def published(self) -> list[dict[str, Any]]:
        """As `nvdp dra slices` prints them: without the server's and the owner's metadata."""
        out = []
        for name in sorted(self.slices):
            obj = copy.deepcopy(self.slices[name])
            obj["metadata"] = {"name": name}
            out.append(obj)
        return out


def _plugin_publishes(profile: Path, config: Path | None, default_mode: str,
                      monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]] | str:
    """What nvidia-dra-plugin publishes for `profile` under `config`, through its own code: the config
    it loads, the devices it prepares, the mode it enters and its SlicePublisher. The GPUs come from
    the profile (NVML's stand-in reads the same file); the CDI facts and IMEX channels, which a
    profile does not describe and the slices do not depend on, are not read. A config the plugin
    refuses gives the refusal's text."""
    from nvdp.daemon.errors import StartupError
    from nvdp.daemon.pernode.mode import ModeGate
    from nvdp.daemon.skeleton import Skeleton
    from nvdp.dra.main import build_parser
    from nvdp.dra.pool.publish import SlicePublisher
    from nvdp.dra.work import DraWork

    server = _ApiServerSlices()
    monkeypatch.setattr("nvdp.daemon.inputs.discover", lambda _config: load_profile(profile))
    monkeypatch.setattr("nvdp.cdi.host.discover_host", lambda *_a, **_k: SimpleNamespace(warnings=()))
    monkeypatch.setattr("nvdp.daemon.imex.channels_on_node", lambda config, log=None: config)
    monkeypatch.setattr("nvdp.dra.pool.publish.list_slices", server.find)
    monkeypatch.setattr("nvdp.dra.pool.publish.create_slice", server.write)
    monkeypatch.setattr("nvdp.dra.pool.publish.replace_slice", server.write)
    monkeypatch.setattr("nvdp.dra.pool.publish.delete_slice", server.delete)
    monkeypatch.setattr("nvdp.dra.pool.publish.get_node_uid", lambda _client, _node: "node-uid")
    env = {"NODE_NAME": NODE, DEFAULT_MODE_ENV: default_mode}
    args = build_parser(env).parse_args(["--config-file", str(config)] if config is not None else [])
    log = logging.getLogger("test-dra-plugin")
    skeleton = Skeleton("nvidia-dra-plugin", log, env)
    process = DraWork(skeleton, args)
    try:
        process.serving = process.prepare(None)
    except StartupError as err:
        return str(err)
    skeleton.gate = ModeGate("dra", None, lambda *a, **k: None, log, per_node=False)
    skeleton.gate.enter(process.mode_of(None))
    process.slices.publisher = SlicePublisher(object(), node=NODE, driver=args.driver_name, log=log)  # type: ignore[arg-type]
    process.slices.publish()
    return server.published()


@pytest.mark.parametrize("default_mode", ["dra", "device-plugin"])
def test_the_preview_is_what_the_plugin_publishes(default_mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every profile of sim/profiles under every valid config (and the built-in defaults)."""
    compared = refused = 0
    for profile in PROFILES:
        for config in [None, *VALID_CONFIGS]:
            with monkeypatch.context() as patch:
                plugin = _plugin_publishes(profile, config, default_mode, patch)
            argv = ["--node", str(profile), "--node-name", NODE, "--default-mode", default_mode]
            code, out, err = run(*argv, *(["--config", str(config)] if config is not None else []))
            where = f"{profile.stem} under {config.name if config else 'defaults'}"
            if isinstance(plugin, str):  # the plugin refuses the config: so does the preview
                assert code == 2 and out == "", where
                assert plugin.split("GPUs: ", 1)[1] in err, where  # for the same reason
                refused += 1
                continue
            assert code == 0, f"{where}: {err}"
            assert json.loads(out) == plugin, where
            compared += 1
    assert compared + refused == len(PROFILES) * (len(VALID_CONFIGS) + 1)
    assert compared > refused


def test_the_preview_shows_each_gpus_numa_node_as_the_plugin_publishes_it() -> None:
    # KEP-6072's standard attribute, from the GPU's PCI device in sysfs (the profile's numa_node): what a
    # claim's matchAttribute aligns a GPU and another driver's device by (docs/dra.md, "NUMA node").
    code, out, _ = run("--node", "mixed-4")
    assert code == 0
    (obj,) = json.loads(out)
    numa = {d["name"]: d["attributes"]["resource.kubernetes.io/numaNode"] for d in obj["spec"]["devices"]}
    assert numa == {"gpu-0": {"int": 0}, "gpu-1": {"int": 0}, "gpu-2": {"int": 1}, "gpu-3": {"int": 1}}
    kubernetes_validate.validate(obj, "1.36", strict=True)
