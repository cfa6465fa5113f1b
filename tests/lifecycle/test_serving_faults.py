"""The serving side under kubelet restarts, plan switches and lost sockets, on real sockets."""

from __future__ import annotations

import os
import socket
import time

import pytest

from nvdp.plugin.grpc_client import server_answers
from nvdp.plugin.server import ResourceServer

from .fakes import eventually
from .serving import GPU, LOG, DialingKubelet, node, planned, serving, short_dir


def test_the_resource_is_served_and_registered_right_after_a_kubelet_flap() -> None:
    """100 kubelet restarts in a row: a registration in flight during a restart must not count."""
    with short_dir() as directory, DialingKubelet(directory) as kubelet, serving(directory) as manager:
        kubelet.wait_for_resource(GPU, count=8, timeout=10)
        socket_path = manager.sockets()[0][1]
        for n in range(100):
            kubelet.restart()
            time.sleep(0.002 * (n % 5))
        kubelet.wait_for_resource(GPU, count=8, timeout=5)
        assert os.path.exists(socket_path)
        # Registered once Register has returned: the kubelet dials back (and may list) before that.
        assert eventually(lambda: manager.registered == {GPU})


def _dead_socket_at(path: str) -> None:
    """Leave a socket file at `path` that nobody listens on, as a process that was killed does."""
    private = f"{path}.dead"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(private)
    os.rename(private, path)


@pytest.mark.parametrize("death", ["socket removed", "socket left behind"])
def test_an_older_instance_serves_again_when_the_newer_one_dies(death: str) -> None:
    """A rolling-update surge: a newer instance takes the socket path over, registers, then dies."""
    with (short_dir() as directory, DialingKubelet(directory) as kubelet,
          serving(directory, socket_check_s=0.05) as older):
        kubelet.wait_for_resource(GPU, count=8, timeout=10)
        first, chosen = planned(directory)
        newer = ResourceServer(first.resources[0], chosen, node(), logger=LOG)
        newer.start()
        newer.register(chosen.flags.plugin.kubelet_socket_path)
        socket_path = newer.socket_path
        taken = os.lstat(socket_path).st_ino
        assert eventually(lambda: kubelet.registrations_of(GPU) == 2)
        time.sleep(0.3)  # several of the older instance's checks: a live newer socket is left alone
        assert os.lstat(socket_path).st_ino == taken
        if death == "socket left behind":
            _dead_socket_at(socket_path)
        newer.stop()  # removes the socket only if it is still its own
        kubelet.wait_for_disconnect(GPU, timeout=5)
        kubelet.wait_for_resource(GPU, count=8, timeout=5)
        assert kubelet.registrations_of(GPU) == 3
        assert eventually(lambda: older.registered == {GPU})  # Register returns after the kubelet's dial
        assert server_answers(socket_path) is None


def test_switching_between_plain_and_time_slicing_keeps_the_stream_and_the_registration() -> None:
    """The device list changes through the open ListAndWatch stream: no restart, no re-registration."""
    with short_dir() as directory, DialingKubelet(directory) as kubelet, serving(directory) as manager:
        kubelet.wait_for_resource(GPU, count=8, timeout=10)
        socket_path = manager.sockets()[0][1]
        served_by = os.lstat(socket_path).st_ino
        for _ in range(5):
            for replicas, count in ((2, 16), (1, 8)):
                switched, chosen = planned(directory, replicas)
                diff = manager.apply(switched, chosen)
                assert diff.changed == (GPU,), diff.describe()
                devices = kubelet.wait_for_resource(GPU, count=count, timeout=5)
                one = devices[-1]["id"]
                assert ("::" in one) == (replicas > 1)
                kubelet.allocate(GPU, [[one]])
        assert kubelet.registrations_of(GPU) == 1
        assert [e for e in kubelet.events if e["type"] == "disconnected"] == []
        assert len([e for e in kubelet.events if e["type"] == "devices"]) == 11  # the first list, 10 switches
        assert os.lstat(socket_path).st_ino == served_by
