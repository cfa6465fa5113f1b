from __future__ import annotations

import logging
import os
import queue
import shutil
import socket
import time
from pathlib import Path

import pytest

from nvdp.plugin.kubelet_watch import KubeletSocketWatcher

LOG = logging.getLogger("test.watch")


def make_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


@pytest.mark.parametrize("use_inotify", [True, False])
def test_socket_recreation_is_reported_each_time(tmp_path: Path, use_inotify: bool) -> None:
    path = tmp_path / "kubelet.sock"
    first = make_socket(path)
    events: queue.Queue[str] = queue.Queue()
    watcher = KubeletSocketWatcher(str(path), lambda: events.put("created"), LOG,
                                   poll_interval=0.01, use_inotify=use_inotify)
    watcher.start()
    try:
        assert watcher.mode == ("inotify" if use_inotify else "polling")
        (tmp_path / "other.sock").write_text("")
        for _ in range(2):
            path.unlink()
            first.close()
            first = make_socket(path)
            assert events.get(timeout=5) == "created"
    finally:
        watcher.stop()
        first.close()
    assert events.empty()


def test_directory_created_later(tmp_path: Path) -> None:
    directory = tmp_path / "device-plugins"
    path = directory / "kubelet.sock"
    events: queue.Queue[str] = queue.Queue()
    watcher = KubeletSocketWatcher(str(path), lambda: events.put("created"), LOG, poll_interval=0.01)
    watcher.start()
    try:
        os.mkdir(directory)
        sock = make_socket(path)
        assert events.get(timeout=5) == "created"
        sock.close()
    finally:
        watcher.stop()


def test_failing_callback_keeps_watching(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    calls: queue.Queue[int] = queue.Queue()

    def callback() -> None:
        calls.put(1)
        raise RuntimeError("boom")

    watcher = KubeletSocketWatcher(str(path), callback, LOG, poll_interval=0.01)
    watcher.start()
    try:
        for _ in range(2):
            sock = make_socket(path)
            calls.get(timeout=5)
            sock.close()
            path.unlink()
    finally:
        watcher.stop()


def test_a_directory_removed_and_created_again_is_watched_anew(tmp_path: Path) -> None:
    """Held open (as a mount or a descriptor does), the old directory never reports its removal."""
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    path = directory / "kubelet.sock"
    events: queue.Queue[str] = queue.Queue()
    watcher = KubeletSocketWatcher(str(path), lambda: events.put("created"), LOG, poll_interval=0.01,
                                   directory_check_s=0.05)
    watcher.start()
    held = os.open(directory, os.O_RDONLY)
    try:
        assert watcher.mode == "inotify"
        for _ in range(2):
            shutil.rmtree(directory)
            os.mkdir(directory)
            sock = make_socket(path)
            assert events.get(timeout=5) == "created"
            sock.close()
            os.close(held)
            held = os.open(directory, os.O_RDONLY)
        time.sleep(0.2)
        assert events.empty()
    finally:
        watcher.stop()
        os.close(held)
