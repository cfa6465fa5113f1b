from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from msgspec.structs import replace

from nvdp.config.model import Config, Flags, PluginFlags
from nvdp.daemon.owned_socket import SocketState
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan, PlannedDevice, PlannedResource
from nvdp.plugin.manager import PlanDiff, PluginManager, diff_plans

from .fakes import eventually, gpu, inventory

LOG = logging.getLogger("test.manager")


def device(gpu_index: int, replica: int | None = None) -> PlannedDevice:
    base = f"GPU-{gpu_index}"
    return PlannedDevice(
        id=base if replica is None else f"{base}::{replica}",
        base_id=base,
        index=str(gpu_index),
        gpu_uuids=(base,),
        gpu_indices=(gpu_index,),
        minors=(gpu_index,),
        numa_node=None,
        memory_bytes=1,
        replica=replica,
    )


def resource(name: str, *devices: PlannedDevice, sharing: str = "none") -> PlannedResource:
    return PlannedResource(name=name, devices=devices, sharing=sharing)  # type: ignore[arg-type]


class FakeServer:
    def __init__(self, resource: PlannedResource, config: Config, inv: Inventory, log: logging.Logger,
                 book: Book) -> None:
        self.resource = resource
        self.config = config
        directory = Path(config.flags.plugin.device_plugin_path)
        self.socket_path = str(directory / f"nvidia-{resource.short_name}.sock")
        self.book = book
        self.started = self.stopped = False
        self.stops = 0
        self.registrations = 0
        self.updates: list[PlannedResource] = []
        self.cdi_classes: list[frozenset[str]] = []  # every set it was given, in order

    def start(self) -> None:
        if self.resource.name in self.book.fail_start:
            raise RuntimeError("socket directory missing")
        self.started, self.stopped = True, False
        Path(self.socket_path).write_text("")

    def socket_state(self) -> SocketState:
        return "ours" if Path(self.socket_path).exists() else "gone"

    def register(self, kubelet_socket: str, timeout: float = 5.0) -> None:
        if not Path(kubelet_socket).exists():
            raise RuntimeError(f"no kubelet socket at {kubelet_socket}")
        self.registrations += 1

    def update(self, resource: PlannedResource) -> None:
        self.resource = resource
        self.updates.append(resource)

    def set_cdi_classes(self, classes: frozenset[str]) -> None:
        self.cdi_classes.append(classes)

    def wait_delivered(self, timeout: float) -> None:
        pass  # no stream to wait for

    def stop(self) -> None:
        self.stops += 1
        self.stopped = True
        Path(self.socket_path).unlink(missing_ok=True)


class Book:
    def __init__(self) -> None:
        self.servers: list[FakeServer] = []
        self.fail_start: set[str] = set()

    def factory(
        self, resource: PlannedResource, config: Config, inv: Inventory, log: logging.Logger,
        recorder: Recorder,
    ) -> FakeServer:
        server = FakeServer(resource, config, inv, log, self)
        self.servers.append(server)
        return server

    def live(self) -> dict[str, FakeServer]:
        return {s.resource.name: s for s in self.servers if s.started and not s.stopped}


def make_config(tmp_path: Path, **plugin: object) -> Config:
    return Config(flags=Flags(plugin=PluginFlags(device_plugin_path=str(tmp_path), **plugin)))  # type: ignore[arg-type]


def no_gate(resource: PlannedResource, config: Config, log: logging.Logger, recorder: Recorder) -> None:
    return None


@pytest.fixture
def book() -> Book:
    return Book()


def manager(tmp_path: Path, book: Book, config: Config | None = None) -> PluginManager:
    return PluginManager(config or make_config(tmp_path), inventory(gpu(0), gpu(1)), LOG, recorder=Recorder(),
                         server_factory=book.factory, gate_factory=no_gate, retry_interval_s=0.01)


GPU = resource("nvidia.com/gpu", device(0), device(1))
SHARED = resource("nvidia.com/gpu.shared", device(0, 0), device(0, 1), device(1, 0), device(1, 1),
                  sharing="time-slicing")


def test_diff_plans() -> None:
    old = Plan(resources=(GPU, resource("nvidia.com/a", device(0))))
    new = Plan(resources=(GPU, resource("nvidia.com/a", device(1)), SHARED))
    assert diff_plans(old, new) == PlanDiff(added=("nvidia.com/gpu.shared",), changed=("nvidia.com/a",),
                                            unchanged=("nvidia.com/gpu",))
    assert diff_plans(old, Plan(resources=(GPU,)), settings_changed=True) == PlanDiff(
        removed=("nvidia.com/a",), restarted=("nvidia.com/gpu",))
    assert diff_plans(old, new).describe() == (
        "added nvidia.com/gpu.shared; updated nvidia.com/a; unchanged nvidia.com/gpu")


def test_apply_starts_and_registers(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU, SHARED)))
    assert eventually(lambda: m.registered == {"nvidia.com/gpu", "nvidia.com/gpu.shared"})
    assert set(book.live()) == {"nvidia.com/gpu", "nvidia.com/gpu.shared"}
    m.stop()
    assert book.live() == {}
    assert list(tmp_path.glob("nvidia-*")) == []


def test_reapply_keeps_unchanged_servers(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU,)))
    assert eventually(lambda: m.registered == {"nvidia.com/gpu"})
    first = book.live()["nvidia.com/gpu"]
    diff = m.apply(Plan(resources=(GPU, SHARED)), config=replace(m.config, source="/new.yaml"))
    assert diff.unchanged == ("nvidia.com/gpu",) and diff.added == ("nvidia.com/gpu.shared",)
    assert eventually(lambda: len(m.registered) == 2)
    assert book.live()["nvidia.com/gpu"] is first
    assert first.registrations == 1 and first.updates == []
    diff = m.apply(Plan(resources=(SHARED,)))
    assert diff.removed == ("nvidia.com/gpu",) and first.stopped
    m.stop()


def test_settings_change_restarts_servers(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU,)))
    assert eventually(lambda: m.registered == {"nvidia.com/gpu"})
    first = book.live()["nvidia.com/gpu"]
    config = make_config(tmp_path, device_list_strategy=("volume-mounts",))
    diff = m.apply(Plan(resources=(GPU,)), config=config)
    assert diff.restarted == ("nvidia.com/gpu",)
    assert first.stopped
    assert eventually(lambda: "nvidia.com/gpu" in book.live())
    assert book.live()["nvidia.com/gpu"].config is config
    m.stop()


def test_cdi_classes_reach_running_and_new_servers_in_place(tmp_path: Path, book: Book) -> None:
    """A re-plan that writes another set of CDI specs (an IMEX channel appeared) updates every running
    server's Allocate names without a restart; resources made later start with the set."""
    (tmp_path / "kubelet.sock").write_text("")
    m = PluginManager(make_config(tmp_path), inventory(gpu(0), gpu(1)), LOG, recorder=Recorder(),
                      server_factory=book.factory, gate_factory=no_gate, retry_interval_s=0.01,
                      cdi_classes=frozenset({"gpu"}))
    m.apply(Plan(resources=(GPU,)))
    assert eventually(lambda: m.registered == {"nvidia.com/gpu"})
    first = book.live()["nvidia.com/gpu"]
    assert first.cdi_classes == [frozenset({"gpu"})]
    with_imex = frozenset({"gpu", "imex-channel"})
    diff = m.apply(Plan(resources=(GPU, SHARED)), cdi_classes=with_imex)
    assert diff.unchanged == ("nvidia.com/gpu",) and not diff.restarted
    assert first.cdi_classes == [frozenset({"gpu"}), with_imex] and not first.stopped
    assert book.live()["nvidia.com/gpu.shared"].cdi_classes == [with_imex]
    m.apply(Plan(resources=(GPU, SHARED)))  # no set given: as before, nothing pushed again
    m.apply(Plan(resources=(GPU, SHARED)), cdi_classes=with_imex)  # the same set: nothing pushed
    assert first.cdi_classes == [frozenset({"gpu"}), with_imex]
    m.stop()


def test_unhealthy_marks_every_replica_of_the_gpu(tmp_path: Path, book: Book,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU, SHARED)))
    assert eventually(lambda: len(m.registered) == 2)
    m.set_health(frozenset({"GPU-1"}), "XID 79 (GPU has fallen off the bus)")
    shared = book.live()["nvidia.com/gpu.shared"].resource
    assert [(d.id, d.healthy) for d in shared.devices] == [
        ("GPU-0::0", True), ("GPU-0::1", True), ("GPU-1::0", False), ("GPU-1::1", False)]
    assert "nvidia.com/gpu.shared: 2 device(s) marked unhealthy (XID 79 (GPU has fallen off the bus)): " \
        "GPU-1::0, GPU-1::1" in caplog.messages
    # A re-plan keeps the GPU down; the health set is what brings it back.
    m.apply(Plan(resources=(GPU, SHARED)))
    shared = book.live()["nvidia.com/gpu.shared"].resource
    assert [d.healthy for d in shared.devices] == [True, True, False, False]
    with caplog.at_level(logging.INFO):
        m.set_health(frozenset(), "recovered from XID 79")
    assert all(d.healthy for d in book.live()["nvidia.com/gpu.shared"].resource.devices)
    assert "nvidia.com/gpu.shared: 2 device(s) healthy again (recovered from XID 79): GPU-1::0, GPU-1::1" \
        in caplog.messages
    m.stop()


def test_kubelet_started_later_is_retried_with_one_log_line(tmp_path: Path, book: Book,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU,)))
    running = m.resource("nvidia.com/gpu")
    assert running is not None
    assert eventually(lambda: running.server.registrations == 0 and len(book.live()) == 1)  # type: ignore[attr-defined]
    time.sleep(0.1)  # several retries
    assert m.registered == frozenset()
    waiting = [r for r in caplog.messages if "not registered with the kubelet yet" in r]
    kubelet = f"{tmp_path}/kubelet.sock"
    assert waiting == [f"nvidia.com/gpu: not registered with the kubelet yet: no kubelet socket at "
                       f"{kubelet}; retrying every 0.01s and when {kubelet} appears"]
    (tmp_path / "kubelet.sock").write_text("")
    m.kubelet_restarted()
    assert eventually(lambda: m.registered == {"nvidia.com/gpu"})
    m.stop()


def test_kubelet_restart_reregisters_and_restarts_removed_sockets(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU, SHARED)))
    assert eventually(lambda: len(m.registered) == 2)
    gpu_server = book.live()["nvidia.com/gpu"]
    shared_server = book.live()["nvidia.com/gpu.shared"]
    Path(shared_server.socket_path).unlink()
    m.kubelet_restarted()
    assert eventually(lambda: gpu_server.registrations == 2 and shared_server.registrations == 2)
    assert not gpu_server.stopped
    # The server whose socket the kubelet removed was restarted (stopped, then listening again).
    assert shared_server.started and Path(shared_server.socket_path).exists()
    assert shared_server.stops == 1
    m.stop()


def test_failed_start_is_retried_in_background(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    book.fail_start.add("nvidia.com/gpu")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU,)))
    assert m.pending()
    book.fail_start.clear()
    for _ in range(500):
        if not m.pending():
            break
        threading.Event().wait(0.01)
    assert m.registered == {"nvidia.com/gpu"}
    m.stop()


class FakeGate:
    def __init__(self) -> None:
        self.ready = threading.Event()
        self.closed = threading.Event()
        self.on_change: list[object] = []

    def wait_until_ready(self, stop: threading.Event | None = None) -> bool:
        while not self.closed.is_set():
            if self.ready.wait(0.01):
                return True
        return False

    def watch(self, on_change: object, ready: bool = True) -> None:
        self.on_change.append(on_change)

    def close(self) -> None:
        self.closed.set()


def test_gated_resource_waits_then_follows_readiness(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    gate = FakeGate()
    mps = replace(SHARED, name="nvidia.com/gpu", sharing="mps")
    m = PluginManager(make_config(tmp_path), inventory(gpu(0), gpu(1)), LOG, recorder=Recorder(),
                      server_factory=book.factory, gate_factory=lambda r, c, lg, rec: gate,
                      retry_interval_s=0.01)
    m.apply(Plan(resources=(mps,)))
    assert book.live() == {}
    gate.ready.set()
    for _ in range(500):
        if m.registered:
            break
        threading.Event().wait(0.01)
    assert m.registered == {"nvidia.com/gpu"}
    (on_change,) = gate.on_change
    on_change(False)  # type: ignore[operator]
    assert not any(d.healthy for d in book.live()["nvidia.com/gpu"].resource.devices)
    on_change(True)  # type: ignore[operator]
    assert all(d.healthy for d in book.live()["nvidia.com/gpu"].resource.devices)
    m.stop()
    assert gate.closed.wait(5)


def test_stopping_a_server_does_not_hold_up_health_updates(tmp_path: Path, book: Book) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    m = manager(tmp_path, book)
    m.apply(Plan(resources=(GPU, SHARED)))
    assert eventually(lambda: len(m.registered) == 2)
    slow = book.live()["nvidia.com/gpu"]
    release = threading.Event()
    stopping = threading.Event()
    plain_stop = slow.stop

    def stop_slowly() -> None:  # a server whose calls take their grace period to finish
        stopping.set()
        release.wait(10)
        plain_stop()

    slow.stop = stop_slowly  # type: ignore[method-assign]
    remover = threading.Thread(target=m.apply, args=(Plan(resources=(SHARED,)),))
    remover.start()
    try:
        assert stopping.wait(5)
        marker = threading.Thread(target=m.set_health, args=(frozenset({"GPU-1"}), "XID 79"))
        marker.start()
        marker.join(5)
        assert not marker.is_alive(), "set_health waited for a server to stop"
    finally:
        release.set()
        remover.join(10)
    m.stop()


def test_only_an_mps_gate_coming_or_going_restarts_a_resource() -> None:
    plain = resource("nvidia.com/gpu", device(0), device(1))
    sliced = resource("nvidia.com/gpu", device(0, 0), device(0, 1), sharing="time-slicing")
    mps = replace(sliced, sharing="mps")
    assert diff_plans(Plan(resources=(plain,)), Plan(resources=(sliced,))).changed == ("nvidia.com/gpu",)
    assert diff_plans(Plan(resources=(sliced,)), Plan(resources=(plain,))).changed == ("nvidia.com/gpu",)
    for old, new in ((plain, mps), (mps, plain), (sliced, mps), (mps, sliced)):
        assert diff_plans(Plan(resources=(old,)), Plan(resources=(new,))).restarted == ("nvidia.com/gpu",)
