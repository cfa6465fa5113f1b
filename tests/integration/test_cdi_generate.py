"""`nvdp cdi generate`: exactly what the plugin writes, printed or written; every error one line with
the fix, never a traceback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim
from sim.nvml import NodeSim

from .cdi_node import SPEC_NAME, VENDOR, CdiNode, make_cdi_node
from .conftest import MakeBarePlugin, clean_env

pytestmark = pytest.mark.slow


@pytest.fixture
def t4(tmp_path: Path, nvml_library: Path) -> tuple[NodeSim, CdiNode]:
    node = NodeSim("t4", tmp_path / "state")
    return node, make_cdi_node(tmp_path / "node", node.inventory)


def env_for(t4: tuple[NodeSim, CdiNode], **extra: str) -> dict[str, str]:
    node, cdi = t4
    return {**clean_env(), **node.env, **cdi.env, "DEVICE_LIST_STRATEGY": "cdi-cri", **extra}


def generate(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "nvdp.cli", "cdi", "generate", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr
    return done


def test_prints_exactly_what_the_plugin_writes(t4: tuple[NodeSim, CdiNode], make_bare_plugin: MakeBarePlugin,
                                               kubelet: KubeletSim) -> None:
    node, cdi = t4
    settings = {"DEVICE_LIST_STRATEGY": "cdi-cri", "DEVICE_ID_STRATEGY": "index"}
    plugin = make_bare_plugin(**node.env, **cdi.env, **settings)
    plugin.start()
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    assert plugin.stop() == 0
    done = generate(env_for(t4, **settings))
    assert done.returncode == 0, done.stderr
    assert done.stdout == cdi.spec_path.read_text() + "\n"  # one spec, one line
    assert done.stderr == ""


def test_roots_on_the_command_line_are_written_into_the_spec(t4: tuple[NodeSim, CdiNode]) -> None:
    done = generate(env_for(t4), "--driver-root", "/run/nvidia/driver", "--dev-root", "/")
    assert done.returncode == 0, done.stderr
    assert '"hostPath":"/dev/nvidia0"' in done.stdout
    assert '"hostPath":"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"' in done.stdout


def test_output_to_a_file_or_a_folder(t4: tuple[NodeSim, CdiNode], tmp_path: Path) -> None:
    env = env_for(t4)
    printed = generate(env).stdout
    target = tmp_path / "out" / "spec.json"
    target.parent.mkdir()
    done = generate(env, "--output", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text() + "\n" == printed
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["spec.json"]  # no temp file left behind
    folder = tmp_path / "specs"
    folder.mkdir()
    done = generate(env, "--output", str(folder))
    assert done.returncode == 0, done.stderr
    assert (folder / SPEC_NAME).read_text() + "\n" == printed
    assert f"written: {folder / SPEC_NAME}" in done.stderr


def test_several_specs_need_a_folder_or_stdout(t4: tuple[NodeSim, CdiNode], tmp_path: Path) -> None:
    _node, cdi = t4
    channels = cdi.driver_root / "dev" / "nvidia-caps-imex-channels"
    channels.mkdir()
    os.mknod(channels / "channel0", stat.S_IFCHR | 0o666, os.makedev(511, 0))
    env = env_for(t4, IMEX_CHANNEL_IDS="0")
    printed = generate(env)
    assert printed.returncode == 0, printed.stderr
    kinds = [line.split('"kind":"')[1].split('"')[0] for line in printed.stdout.splitlines()]
    assert kinds == [f"{VENDOR}/gpu", f"{VENDOR}/imex-channel"]
    done = generate(env, "--output", str(tmp_path / "one.json"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    kinds_text = f"{VENDOR}/gpu, {VENDOR}/imex-channel"
    assert f"has 2 specs ({kinds_text}), a file holds one; pass a directory" in done.stderr


@pytest.mark.parametrize(
    ("extra", "args", "message"),
    [
        ({"NVDP_HOST_HOOK_DIR": "/nonexistent"}, (),
         "the CDI hook /usr/bin/nvidia-ctk was looked for at /nonexistent/nvidia-ctk"),
        ({}, ("--config", "/nonexistent.yaml"), "--config /nonexistent.yaml: no such file"),
        ({"CONFIG_DIR": "/available-configs"}, (), "--config /available-configs/<entry>"),
        ({"DEVICE_ID_STRATEGY": "serial"}, (), "DEVICE_ID_STRATEGY: flags.plugin.deviceIDStrategy"),
        ({"LD_LIBRARY_PATH": ""}, (), "NVML is not available"),
        ({"DRIVER_ROOT_CTR_PATH": "/etc/hostname"}, (),
         "the container driver root /etc/hostname is not a folder"),
    ],
    ids=["missing-hook", "missing-config", "per-node-config", "bad-env", "no-nvml", "driver-root-a-file"],
)
def test_errors_are_one_line_with_the_fix(t4: tuple[NodeSim, CdiNode], extra: dict[str, str],
                                          args: tuple[str, ...], message: str) -> None:
    done = generate(env_for(t4, **extra), *args)
    assert done.returncode == 1, done.stdout
    assert done.stdout == ""
    assert done.stderr.startswith("nvdp cdi generate: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


def test_a_relative_root_is_a_usage_error(t4: tuple[NodeSim, CdiNode]) -> None:
    done = generate(env_for(t4), "--driver-root", "run/nvidia/driver")
    assert done.returncode == 2
    assert "'run/nvidia/driver' is not an absolute path" in done.stderr


def test_unknown_feature_flags_are_a_warning(t4: tuple[NodeSim, CdiNode]) -> None:
    done = generate(env_for(t4, CDI_FEATURE_FLAGS="a-future-flag"))
    assert done.returncode == 0
    assert "warning: unknown CDI feature flag(s) a-future-flag" in done.stderr


# --- on a host, as nvidia-ctk cdi generate is run ------------------------------------------------

HOST_SETTINGS = {"--cdi-disable-hooks": "enable-cuda-compat",
                 "--cdi-feature-flags": "no-additional-gids-for-device-nodes"}


def host_env(t4: tuple[NodeSim, CdiNode]) -> dict[str, str]:
    """A shell on the host: the stand-in NVML, no plugin settings, no container driver root."""
    node, _cdi = t4
    assert not os.path.exists("/driver-root")
    return {**clean_env(), **node.env, "DEVICE_LIST_STRATEGY": "cdi-cri"}


def test_on_a_host_the_files_are_read_where_the_driver_root_points(t4: tuple[NodeSim, CdiNode]) -> None:
    """`--driver-root R --dev-root D`, as nvidia-ctk is run: the files are read under R (this
    machine's / has no libcuda), and the spec names them there."""
    _node, cdi = t4
    root = str(cdi.driver_root)
    env = {**host_env(t4), "NVDP_HOST_HOOK_DIR": str(cdi.hook_dir)}
    done = generate(env, "--driver-root", root, "--dev-root", root)
    assert done.returncode == 0, done.stderr
    assert f'"hostPath":"{root}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"' in done.stdout
    assert f'"hostPath":"{root}/dev/nvidia0"' in done.stdout
    hook = str(cdi.hook_dir / "nvidia-ctk")
    flagged = generate(host_env(t4), "--driver-root", root, "--nvidia-cdi-hook-path", hook)
    assert flagged.returncode == 0, flagged.stderr
    assert f'"path":"{hook}"' in flagged.stdout


def test_on_a_host_the_device_nodes_are_read_under_the_dev_root(t4: tuple[NodeSim, CdiNode],
                                                               tmp_path: Path) -> None:
    """`--dev-root D` as nvidia-ctk reads it: the device nodes under D/dev, not under the driver root
    nor this machine's /dev, and the spec names them there."""
    _node, cdi = t4
    root, dev_root = str(cdi.driver_root), tmp_path / "host-dev-root"
    dev_root.mkdir()
    (cdi.driver_root / "dev").rename(dev_root / "dev")
    env = {**host_env(t4), "NVDP_HOST_HOOK_DIR": str(cdi.hook_dir)}
    done = generate(env, "--driver-root", root, "--dev-root", str(dev_root))
    assert done.returncode == 0, done.stderr
    assert f'"hostPath":"{dev_root}/dev/nvidia0"' in done.stdout
    assert f'"hostPath":"{dev_root}/dev/nvidiactl"' in done.stdout
    assert "no /dev/nvidiactl under the dev root" not in done.stderr


def test_the_plugin_writes_what_the_command_prints_for_the_same_settings(
        t4: tuple[NodeSim, CdiNode], make_bare_plugin: MakeBarePlugin, kubelet: KubeletSim) -> None:
    """The plugin's flags for its CDI settings, given to both (the plugin in its pod would see the
    driver root at its container driver root; here both read it where it is)."""
    node, cdi = t4
    root, hook = str(cdi.driver_root), str(cdi.hook_dir / "nvidia-ctk")
    settings = ["--driver-root", root, "--dev-root", root, "--nvidia-cdi-hook-path", hook,
                *(part for flag, value in HOST_SETTINGS.items() for part in (flag, value))]
    plugin = make_bare_plugin(**node.env, DEVICE_LIST_STRATEGY="cdi-cri", NVDP_CDI_DIR=str(cdi.cdi_dir))
    plugin.start(*settings, "--container-driver-root", root)
    kubelet.wait_for_resource("nvidia.com/gpu", count=1, timeout=10)
    assert plugin.stop() == 0
    written = cdi.spec_path.read_text()
    assert "enable-cuda-compat" not in written and '"create-symlinks"' in written
    done = generate(host_env(t4), *settings)
    assert done.returncode == 0, done.stderr
    assert done.stdout == written + "\n"
    same = generate(host_env(t4), *settings, "--container-driver-root", root)
    assert same.stdout == done.stdout


def test_the_hook_fix_names_flags_the_command_takes(t4: tuple[NodeSim, CdiNode]) -> None:
    _node, cdi = t4
    env = host_env(t4)
    missing = generate(env, "--driver-root", str(cdi.driver_root), "--nvidia-cdi-hook-path", "/no/such/hook")
    assert missing.returncode == 1
    assert "--nvidia-cdi-hook-path" in missing.stderr and "--cdi-disable-hooks=all" in missing.stderr
    done = generate(env, "--driver-root", str(cdi.driver_root), "--nvidia-cdi-hook-path", "/no/such/hook",
                    "--cdi-disable-hooks=all")
    assert done.returncode == 0, done.stderr
    assert "hooks" not in done.stdout
