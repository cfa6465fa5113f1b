"""The plugin's gRPC calls as a client: Register with the kubelet, and the liveness probe of a resource's
own server (used by /healthz and `nvdp doctor`).

Each call opens a fresh channel and closes it: a kubelet that just re-created its socket must not be
reached through a shared connection still backing off from the old one.
"""

from __future__ import annotations

import logging
import os

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.report.recording import Recorder
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.wire import pb_grpc, register_request

_HINT = (
    "check that the kubelet runs and that flags.plugin.kubeletSocket / devicePluginPath point at its "
    "device-plugins directory (k3s and microk8s use other paths)"
)


class RegistrationError(RuntimeError):
    """The kubelet could not be reached or refused the plugin; the message says which and what to check."""


def fresh_channel(socket_path: str) -> grpc.Channel:
    """A channel to a unix socket with a private subchannel pool (no connection shared with others)."""
    return grpc.insecure_channel(f"unix://{socket_path}", options=[("grpc.use_local_subchannel_pool", 1)])


def register(kubelet_socket: str, name: str, endpoint: str, timeout: float, log: logging.Logger,
             recorder: Recorder) -> None:
    """Announce resource `name`, served on `endpoint` in the kubelet's directory, to its Registration
    service (`recorder` counts the attempts); RegistrationError says why not."""
    request = register_request(name, endpoint)
    if not os.path.exists(kubelet_socket):
        recorder.registration(name, False)
        raise RegistrationError(f"cannot register {name}: no kubelet socket at {kubelet_socket}; {_HINT}")
    try:
        # wait_for_ready: connect (or keep retrying the connection) within the same deadline.
        with fresh_channel(kubelet_socket) as channel:
            pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=True)
    except grpc.RpcError as err:
        recorder.registration(name, False)
        if not os.path.exists(kubelet_socket):
            raise RegistrationError(
                f"cannot register {name}: {kubelet_socket} was removed while registering (the kubelet "
                "is restarting); registering again when it is back"
            ) from err
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise RegistrationError(
                f"cannot register {name}: the kubelet did not answer on {kubelet_socket} within "
                f"{timeout:g}s; {_HINT}"
            ) from err
        raise RegistrationError(
            f"the kubelet at {kubelet_socket} refused {name}: {err.code().name}: {err.details()}"
        ) from err
    recorder.registration(name, True)
    log.info("Registered device plugin for '%s' with Kubelet", name)


def server_answers(socket_path: str, timeout: float = 2.0) -> str | None:
    """None when the resource's gRPC server answers GetDevicePluginOptions within `timeout`, else why not.

    Bounded, so a stuck server makes a liveness probe say "not live" instead of timing out.
    """
    try:
        with fresh_channel(socket_path) as channel:
            pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=timeout)
    except grpc.RpcError as err:
        return f"does not answer on {socket_path}: {err.code().name}"
    return None
