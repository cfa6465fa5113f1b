"""What the MPS daemon leaves on the host, and where its tmpfs is mounted (host namespace or container)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.mps import main
from nvdp.mps.commands import MpsGpu, MpsSettings
from nvdp.mps.node import host_setup, hostmount
from nvdp.mps.paths import ResourcePaths


def settings(name: str) -> MpsSettings:
    return MpsSettings(resource_name=name, gpus=(MpsGpu("GPU-1", 0, 0, "Tesla T4", 1 << 30, (7, 5), 2),))


def test_final_stop_removes_pipe_and_marker_and_keeps_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(hostmount.HOST_NAMESPACE_ENV, raising=False)
    for name in ("nvidia.com/gpu", "nvidia.com/gpu.shared"):
        paths = ResourcePaths(tmp_path, name)
        paths.pipe_dir.mkdir(parents=True)
        paths.log_dir.mkdir(parents=True)
        paths.ready_marker.touch()
        (paths.log_dir / "control.log").write_text("log")
    (tmp_path / "shm").mkdir()
    (tmp_path / "nvml-sim").mkdir()
    host_setup.clean_up([settings("nvidia.com/gpu")], tmp_path)
    gpu = ResourcePaths(tmp_path, "nvidia.com/gpu")
    assert not gpu.pipe_dir.exists() and not gpu.ready_marker.exists()
    assert (gpu.log_dir / "control.log").read_text() == "log", "the bounded log stays for post-mortems"
    assert ResourcePaths(tmp_path, "nvidia.com/gpu.shared").pipe_dir.is_dir(), (
        "another config's resource stays"
    )
    host_setup.clean_up([settings("nvidia.com/gpu.shared")], tmp_path)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == [
        "nvidia.com", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/gpu.shared/log",
        "nvidia.com/gpu.shared/log/control.log", "nvidia.com/gpu/log", "nvidia.com/gpu/log/control.log",
        "nvml-sim", "shm",
    ]  # fmt: skip


def test_host_namespace_only_when_the_chart_says_the_pids_are_the_hosts() -> None:
    assert not hostmount.wanted({})
    assert not hostmount.wanted({hostmount.HOST_NAMESPACE_ENV: "false"})
    assert hostmount.wanted({hostmount.HOST_NAMESPACE_ENV: "true"})
    # Here this process, its parent and (if readable) PID 1 share one mount namespace: nothing to join.
    assert hostmount.host_namespace() is None


def host_mode(monkeypatch: pytest.MonkeyPatch, namespace: Path | None) -> None:
    monkeypatch.setenv("MPS_ROOT", "/run/nvidia/mps")
    monkeypatch.setenv(hostmount.HOST_NAMESPACE_ENV, "true")
    monkeypatch.setattr(hostmount, "host_namespace", lambda parent_pid=None: namespace)


def test_mount_shm_dry_run_in_the_host_namespace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host_mode(monkeypatch, Path("/proc/42/ns/mnt"))
    assert main.main(["mount-shm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "in the host's mount namespace (/proc/42/ns/mnt): mount -t tmpfs shm /run/nvidia/mps/shm" in out


def test_host_mount_failure_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host_mode(monkeypatch, Path("/proc/42/ns/mnt"))

    def refuse(namespace: Path) -> None:
        raise hostmount.HostMountError(
            1, f"joining the host's mount namespace ({namespace}): Operation not permitted"
        )

    monkeypatch.setattr(hostmount, "enter_host_namespace", refuse)
    assert main.main(["mount-shm"]) == 1
    err = capsys.readouterr().err
    assert "Operation not permitted" in err and "mps.enableHostPID=true" in err and "privileged" in err


def test_no_host_namespace_to_join_fails_instead_of_mounting_where_nobody_sees_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host_mode(monkeypatch, None)
    assert main.main(["mount-shm", "--dry-run"]) == 1
    assert "cannot find the host's mount namespace" in capsys.readouterr().err
