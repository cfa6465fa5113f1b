"""The plugin's endpoints answer from a PluginState alone: a stand-in state is all they need."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nvdp.daemon.report.probes import ResourceStatus
from nvdp.daemon.report.recording import Recorder
from nvdp.plugin.observe import PluginEndpoints
from nvdp.plugin.state import PluginState


class State:
    def __init__(self, kubelet: Path, registered: bool = True) -> None:
        self.kubelet = kubelet
        self.registered = registered

    def not_serving(self) -> str | None:
        return None

    def resources(self) -> Sequence[ResourceStatus]:
        return [ResourceStatus("nvidia.com/gpu", self.registered, healthy=3, unhealthy=1)]

    def kubelet_socket(self) -> str | None:
        return str(self.kubelet)

    def responsive(self, timeout: float) -> bool | None:
        return True

    def server_sockets(self) -> Sequence[tuple[str, str]]:
        return [("nvidia.com/gpu", "/nonexistent/nvidia-gpu.sock")]

    def health_stalled(self, now: float) -> str | None:
        return None


def endpoints(state: PluginState) -> PluginEndpoints:
    return PluginEndpoints(state, Recorder(), call_server=lambda path: "unexpected call")


def test_ready_only_while_the_kubelet_socket_is_there(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet.sock"
    served = endpoints(State(kubelet))
    absent = served.readyz()
    assert absent.status == 503
    assert absent.body.decode().splitlines() == [
        "not ready",
        f"kubelet: its socket {kubelet} is absent (kubelet not running, or restarting); the resources "
        "register when it is back",
        "nvidia.com/gpu: not registered (no kubelet)",
    ]
    kubelet.touch()
    assert served.readyz().body == b"ready\nnvidia.com/gpu: registered\n"
    assert endpoints(State(kubelet, registered=False)).readyz().status == 503


def test_live_without_a_kubelet_and_without_a_started_server(tmp_path: Path) -> None:
    answer = endpoints(State(tmp_path / "kubelet.sock")).healthz()
    assert answer.status == 200
    assert answer.body == b"live\nmanager: ok\nhealth loop: ok\n"
