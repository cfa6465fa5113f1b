"""Writing spec files: atomic and 0644, untouched when unchanged, stale classes of nvdp's only removed,
and refusals that name the path and the fix."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.cdi.build import SpecSet
from nvdp.cdi.errors import CdiError
from nvdp.cdi.spec import ContainerEdits, Device, DeviceNode, Spec, encode, kind_of
from nvdp.cdi.write import write_file, write_specs
from tests.cdi.trees import IS_ROOT, needs_root, touch

SRC = Path(__file__).resolve().parents[2] / "src"


def spec(cls: str, name: str = "0") -> Spec:
    node = DeviceNode(path=f"/dev/{name}", host_path=f"/dev/{name}")
    device = Device(name=name, container_edits=ContainerEdits(device_nodes=(node,)))
    return Spec(cdi_version="0.5.0", kind=kind_of(cls), devices=(device,), container_edits=ContainerEdits())


def specs(*classes: str, name: str = "0") -> SpecSet:
    return SpecSet(tuple(spec(c, name) for c in classes))


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_writes_one_file_per_class_0644_in_a_new_0755_folder(tmp_path: Path, umask_077: None) -> None:
    folder = tmp_path / "run/cdi"
    result = write_specs(specs("gpu", "imex-channel"), str(folder))
    gpu = folder / "k8s.device-plugin.nvidia.com-gpu.json"
    imex = folder / "k8s.device-plugin.nvidia.com-imex-channel.json"
    assert result.written == (str(gpu), str(imex))
    assert gpu.read_bytes() == encode(spec("gpu"))
    assert stat.S_IMODE(gpu.stat().st_mode) == 0o644
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert sorted(p.name for p in folder.iterdir()) == [gpu.name, imex.name]  # no temp file left


def test_unchanged_bytes_are_not_written_again(tmp_path: Path) -> None:
    write_specs(specs("gpu"), str(tmp_path))
    path = tmp_path / "k8s.device-plugin.nvidia.com-gpu.json"
    before = path.stat()
    result = write_specs(specs("gpu"), str(tmp_path))
    assert (result.written, result.unchanged) == ((), (str(path),))
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert write_file(encode(spec("gpu")), str(path)) is False


def test_a_change_replaces_the_file_by_rename(tmp_path: Path) -> None:
    write_specs(specs("gpu"), str(tmp_path))
    path = tmp_path / "k8s.device-plugin.nvidia.com-gpu.json"
    inode = path.stat().st_ino
    result = write_specs(specs("gpu", name="1"), str(tmp_path))
    assert result.written == (str(path),)
    assert path.stat().st_ino != inode  # a new file renamed over the old: readers never see half of one
    assert path.read_bytes() == encode(spec("gpu", "1"))


def test_only_nvdps_own_stale_classes_are_removed(tmp_path: Path) -> None:
    write_specs(specs("gpu", "imex-channel", "gds"), str(tmp_path))
    ours = "k8s.device-plugin.nvidia.com"
    others = ["nvidia.com-gpu.json", f"{ours}-gds.yaml", f"{ours}-.json", f"{ours}-gpu.json.bak",
              "readme.txt"]
    for name in others:
        touch(tmp_path / name)
    result = write_specs(specs("gpu"), str(tmp_path))
    assert result.removed == (str(tmp_path / "k8s.device-plugin.nvidia.com-gds.json"),
                              str(tmp_path / "k8s.device-plugin.nvidia.com-imex-channel.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*others, f"{ours}-gpu.json"])


def write_unprivileged(folder: Path) -> str:
    """write_specs in a forked child that cannot override file modes (as root, it drops to nobody):
    the CdiError's message, or "" when it wrote."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(reader)
            if IS_ROOT:
                os.setresuid(65534, 65534, 65534)
            try:
                write_specs(specs("gpu"), str(folder))
            except CdiError as err:
                os.write(writer, str(err).encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return message


def test_a_read_only_folder_is_refused_with_the_path_and_the_fix() -> None:
    base = Path(tempfile.mkdtemp(prefix="nvdp-cdi-ro-"))  # under /tmp, which nobody may traverse
    try:
        os.chmod(base, 0o755)
        folder = base / "cdi"
        folder.mkdir(mode=0o555)
        os.chmod(folder, 0o555)
        message = write_unprivileged(folder)
        assert f"cannot write {folder}/k8s.device-plugin.nvidia.com-gpu.json: Permission denied" in message
        assert "mount the host's /var/run/cdi there read-write" in message
        assert list(folder.iterdir()) == []
    finally:
        os.chmod(base / "cdi", 0o755)
        shutil.rmtree(base)


def test_a_folder_whose_parent_is_a_file_is_refused(tmp_path: Path) -> None:
    touch(tmp_path / "file")
    with pytest.raises(CdiError, match=rf"cannot create the folder {tmp_path}/file/cdi: Not a directory; "):
        write_specs(specs("gpu"), str(tmp_path / "file/cdi"))
    with pytest.raises(CdiError, match=r"cannot write .*/file/k8s\.device-plugin\.nvidia\.com-gpu\.json"):
        write_file(b"{}", str(tmp_path / "file/k8s.device-plugin.nvidia.com-gpu.json"))


@pytest.mark.slow
@needs_root
def test_a_read_only_mount_is_named_as_such(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(SRC)!r})\n"
            "from nvdp.cdi.errors import CdiError\n"
            "from nvdp.cdi.write import write_file\n"
            f"try:\n    write_file(b'{{}}', {str(folder / 'spec.json')!r})\n"
            "except CdiError as err:\n    print(err)\n")
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && exec "$2" -c "$3"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(folder),
            sys.executable, code]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert f"cannot write {folder}/spec.json: read-only file system; " in result.stdout
