from __future__ import annotations

import ctypes
import logging
import queue
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from nvdp.config.model import Config, Flags, PluginFlags
from nvdp.daemon.health import HealthMonitor, event_targets
from nvdp.daemon.report import recording
from nvdp.health.ledger import Change, Ledger, Settings
from nvdp.health.nvml_event import event_fields
from nvdp.health.state import read_state, request_clear
from nvdp.health.xid_policy import XidPolicy, policy_from_config, xid_policy

from .fakes import Event, FakeNvml, NVMLError, eventually, gpu, inventory, mig_device

LOG = logging.getLogger("test.health")


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_default_policy_ignores_application_errors(xid: int) -> None:
    policy = xid_policy()
    assert policy.enabled
    assert not policy.is_critical(xid)


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 94, 95])
def test_default_policy_counts_hardware_errors(xid: int) -> None:
    assert xid_policy().is_critical(xid)


@pytest.mark.parametrize("word", ["all", "xids", "ALL", " Xids "])
def test_disable_all_turns_health_checks_off(word: str) -> None:
    policy = xid_policy(disable=[word])
    assert not policy.enabled
    assert not policy.is_critical(79)
    assert policy.describe() == "health checks disabled"


def test_disable_numbers_are_extra_ignored_xids() -> None:
    policy = xid_policy(disable=["48,64", "79"])
    assert policy.enabled
    assert not policy.is_critical(48)
    assert not policy.is_critical(64)
    assert not policy.is_critical(79)
    assert not policy.is_critical(13)
    assert policy.is_critical(94)


def test_enable_numbers_override_ignored_including_defaults() -> None:
    policy = xid_policy(disable=["48"], enable=["48", "13"])
    assert policy.is_critical(48)
    assert policy.is_critical(13)
    assert not policy.is_critical(31)
    assert policy.describe() == "ignoring XIDs [31, 43, 45, 68, 109]"


def test_enable_all_counts_every_xid() -> None:
    policy = xid_policy(disable=["48"], enable=["all"])
    assert all(policy.is_critical(x) for x in (13, 31, 43, 45, 48, 68, 109))
    assert policy.describe() == "every XID marks a device unhealthy"


def test_disable_all_wins_over_enable() -> None:
    assert not xid_policy(disable=["all"], enable=["79"]).is_critical(79)


def test_malformed_values_are_kept_for_the_log_and_do_not_crash() -> None:
    policy = xid_policy(disable=["13x", "48", "-1", ""], enable=["nope"])
    assert policy.malformed == ("13x", "-1", "nope")
    assert not policy.is_critical(48)


def test_policy_from_config_reads_plugin_flags() -> None:
    plugin = PluginFlags(disable_health_checks=("79",), enable_health_checks=("13",))
    config = Config(flags=Flags(plugin=plugin))
    policy = policy_from_config(config)
    assert not policy.is_critical(79)
    assert policy.is_critical(13)


def test_event_targets_gpu_and_mig() -> None:
    inv = inventory(gpu(0, mig=(mig_device(0, 0, 1, 0), mig_device(0, 1, 2, 0))), gpu(1))
    assert event_targets(inv, "GPU-0", 0xFFFFFFFF, 0xFFFFFFFF) == {"GPU-0"}
    assert event_targets(inv, "GPU-0", 2, 0) == {"MIG-0-1"}
    assert event_targets(inv, "GPU-0", 7, 0) == frozenset()
    assert event_targets(inv, "GPU-9", 1, 0) == {"GPU-9"}


def test_an_event_on_a_mig_device_made_for_a_claim_marks_its_gpu() -> None:
    """migStrategy dynamic: a MIG device made after start-up serves a claim through one of the GPU's
    placements, so its fault takes the GPU's placements down instead of being ignored."""
    inv = inventory(gpu(0, mig=(mig_device(0, 0, 1, 0),)))
    assert event_targets(inv, "GPU-0", 7, 0, made_on_demand=True) == {"GPU-0"}
    assert event_targets(inv, "GPU-0", 1, 0, made_on_demand=True) == {"MIG-0-0"}


class Reports:
    """The consumer: each call as (the devices the changes name, their reasons), and the latest
    set of all unhealthy UUIDs."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[frozenset[str], str]] = queue.Queue()
        self.unhealthy: frozenset[str] = frozenset()
        self.kinds: list[str] = []

    def __call__(self, unhealthy: frozenset[str], changes: Sequence[Change]) -> None:
        self.unhealthy = unhealthy
        self.kinds += [c.kind for c in changes]
        devices = frozenset().union(*(c.devices for c in changes))
        self.calls.put((devices, "; ".join(sorted({c.reason for c in changes}))))

    def next(self) -> tuple[frozenset[str], str]:
        return self.calls.get(timeout=5)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def start_monitor(nvml: FakeNvml, policy: XidPolicy | None = None, settings: Settings | None = None,
                  clock: Clock | None = None, **kwargs: object) -> tuple[HealthMonitor, Reports]:
    inv = inventory(gpu(0), gpu(1, mig=(mig_device(1, 0, 3, 0),)))
    reports = Reports()
    ledger = Ledger(settings or Settings(after=None))
    monitor = HealthMonitor(inv, policy or xid_policy(), ledger, reports, LOG,
                            recorder=recording.Recorder(), nvml=nvml, wait_ms=20, clock=clock or Clock(),
                            **kwargs)  # type: ignore[arg-type]
    return monitor, reports


def test_monitor_reports_critical_xid_and_skips_ignored_and_ecc() -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    monitor, reports = start_monitor(nvml)
    assert monitor.start()
    try:
        assert nvml.registered == {"GPU-0": 0xA, "GPU-1": 0xA}
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 13))
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x2, 0))
        nvml.events.put(Event(nvml.handles["GPU-1"], 0x8, 48, 3, 0))
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 79))
        assert reports.next() == (frozenset({"MIG-1-0"}), "XID 48 (double-bit ECC error)")
        assert reports.next() == (frozenset({"GPU-0"}), "XID 79 (GPU has fallen off the bus)")
    finally:
        monitor.stop()
    assert reports.calls.empty()
    assert nvml.init_count == 0


class XidCounter(recording.Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.counted: list[tuple[str, int, str]] = []

    def xid(self, gpu: str, code: int, action: str) -> None:
        self.counted.append((gpu, code, action))


def test_an_xid_is_counted_before_its_devices_are_marked() -> None:
    """Whoever sees a device Unhealthy (the kubelet, a metrics scrape) must find its XID counted."""
    counter = XidCounter()
    counted = counter.counted
    at_report: queue.Queue[list[tuple[str, int, str]]] = queue.Queue()
    nvml = FakeNvml(["GPU-0"])

    def report(_uuids: frozenset[str], _changes: Sequence[Change]) -> None:
        at_report.put(list(counted))

    monitor = HealthMonitor(inventory(gpu(0)), xid_policy(), Ledger(Settings()), report, LOG,
                            recorder=counter, nvml=nvml, wait_ms=20)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 79))
        assert at_report.get(timeout=5) == [("GPU-0", 79, "critical")]
    finally:
        monitor.stop()


def test_monitor_repeated_xid_is_reported_once() -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    monitor, reports = start_monitor(nvml)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 48))
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 48))
        nvml.events.put(Event(nvml.handles["GPU-1"], 0x8, 48))
        assert reports.next()[0] == {"GPU-0"}
        assert reports.next()[0] == {"GPU-1"}
    finally:
        monitor.stop()
    assert reports.calls.empty()


def test_monitor_lost_gpu_on_wait_error() -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    monitor, reports = start_monitor(nvml)
    assert monitor.start()
    try:
        nvml.lost.add("GPU-1")
        nvml.events.put(NVMLError(nvml.NVML_ERROR_GPU_IS_LOST))
        uuids, reason = reports.next()
        assert uuids == {"GPU-1"}
        assert reason == "GPU is lost (NVML error 15)"
    finally:
        monitor.stop()


def test_monitor_unexplained_wait_error_marks_all() -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    monitor, reports = start_monitor(nvml)
    assert monitor.start()
    try:
        nvml.events.put(NVMLError(999))
        uuids, reason = reports.next()
        assert uuids == {"GPU-0", "GPU-1"}
        assert reason == "error waiting for NVML events (NVML error 999)"
    finally:
        monitor.stop()


def test_monitor_too_old_gpu_is_skipped_not_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    nvml.not_supported.add("GPU-0")
    monitor, reports = start_monitor(nvml)
    with caplog.at_level(logging.INFO):
        assert monitor.start()
    monitor.stop()
    assert "GPU 0 (GPU-0) is too old for health checks; skipping it" in caplog.messages
    assert list(nvml.registered) == ["GPU-1"]
    assert reports.calls.empty()


def test_monitor_disabled_uses_no_nvml(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(["GPU-0"])
    monitor, _ = start_monitor(nvml, xid_policy(disable=["all", "x1"]))
    with caplog.at_level(logging.INFO):
        assert not monitor.start()
    monitor.stop()
    assert nvml.init_count == 0 and nvml.waits == 0
    assert "Ignoring malformed XID value 'x1': use 'all', 'xids' or XID numbers" in caplog.messages


def test_monitor_start_failure_leaves_health_checks_off(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(["GPU-0"])

    def broken() -> object:
        raise NVMLError(12)

    nvml.nvmlEventSetCreate = broken  # type: ignore[method-assign]
    monitor, _ = start_monitor(nvml)
    assert not monitor.start()
    assert nvml.init_count == 0
    assert caplog.messages[-1] == (
        "Failed to start health checks: NVML error 12; continuing with health checks disabled"
    )


def test_monitor_consumer_error_does_not_stop_the_loop() -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    seen: list[frozenset[str]] = []
    done: queue.Queue[bool] = queue.Queue()

    def consumer(uuids: frozenset[str], changes: Sequence[Change]) -> None:
        seen.append(frozenset().union(*(c.devices for c in changes)))
        if len(seen) == 1:
            raise RuntimeError("boom")
        done.put(True)

    monitor = HealthMonitor(inventory(gpu(0), gpu(1)), xid_policy(), Ledger(Settings()), consumer, LOG,
                            recorder=recording.Recorder(), nvml=nvml, wait_ms=20)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 48))
        nvml.events.put(Event(nvml.handles["GPU-1"], 0x8, 48))
        assert done.get(timeout=5)
    finally:
        monitor.stop()
    assert seen == [frozenset({"GPU-0"}), frozenset({"GPU-1"})]


class Unreadable:
    """An event field the binding cannot turn into a number."""

    def __int__(self) -> int:
        raise TypeError("unexpected event data")


def test_an_event_that_cannot_be_handled_is_logged_and_checking_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml(["GPU-0", "GPU-1"])
    monitor, reports = start_monitor(nvml)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, Unreadable()))  # type: ignore[arg-type]
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 48))
        assert reports.next() == (frozenset({"GPU-0"}), "XID 48 (double-bit ECC error)")
    finally:
        monitor.stop()
    failures = [r for r in caplog.records if r.getMessage().startswith("Health checking failed unexpectedly")]
    assert len(failures) == 1 and failures[0].exc_info is not None


def test_a_guarded_thread_that_dies_takes_the_process_down(caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.daemon.guard import guarded_thread, on_fatal

    called = threading.Event()
    on_fatal(called.set)
    try:
        def broken() -> None:
            raise RuntimeError("bug")

        thread = guarded_thread(broken, "t", LOG, "The test thread")
        thread.start()
        thread.join(5)
        assert called.is_set()
    finally:
        on_fatal(None)
    assert "The test thread stopped unexpectedly; the plugin cannot go on without it" in caplog.messages


def test_an_nvml_event_is_read_whole_with_the_device_as_its_address() -> None:
    pynvml = pytest.importorskip("pynvml")
    device = ctypes.create_string_buffer(16)
    data = pynvml.c_nvmlEventData_t()
    data.device = ctypes.cast(device, pynvml.c_nvmlDevice_t)
    data.eventType, data.eventData = 0x8, 79
    data.gpuInstanceId, data.computeInstanceId = 3, 0xFFFFFFFF
    assert event_fields(data) == (ctypes.addressof(device), 0x8, 79, 3, 0xFFFFFFFF)


def test_an_event_with_another_layout_is_read_field_by_field() -> None:
    # Same names and size as nvml.h's, other offsets: unpacked as nvml.h's, eventType would be 48 << 32 | 8.
    class Narrow(ctypes.Structure):
        _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_uint32),
                    ("eventData", ctypes.c_uint32), ("gpuInstanceId", ctypes.c_uint64),
                    ("computeInstanceId", ctypes.c_uint64)]

    handle = object()
    narrow = Narrow(None, 0x8, 48, 1, 2)
    assert ctypes.sizeof(Narrow) == ctypes.sizeof(pytest.importorskip("pynvml").c_nvmlEventData_t)
    assert event_fields(narrow) == (0, 0x8, 48, 1, 2)
    assert event_fields(Event(handle, 0x8, 48)) == (id(handle), 0x8, 48, 0xFFFFFFFF, 0xFFFFFFFF)


def wait_for(reports: Reports, kind: str) -> tuple[frozenset[str], str]:
    while True:
        devices, reason = reports.next()
        if reports.kinds[-1] == kind:
            return devices, reason


def test_a_transient_xid_recovers_after_the_quiet_period_and_a_new_one_restarts_it() -> None:
    nvml, clock = FakeNvml(["GPU-0", "GPU-1"]), Clock()
    monitor, reports = start_monitor(nvml, settings=Settings(after=300), clock=clock)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 94))
        assert reports.next() == (frozenset({"GPU-0"}), "XID 94 (contained ECC error)")
        clock.now += 200
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 94))  # quiet period starts again
        assert eventually(lambda: monitor.ledger.faults()["GPU-0"].last_fault == clock.now)
        clock.now += 200
        assert not eventually(lambda: not reports.unhealthy, timeout=0.3)
        clock.now += 101
        devices, reason = wait_for(reports, "recovered")
        assert devices == {"GPU-0"} and reason == "recovered from XID 94 (contained ECC error)"
        assert reports.unhealthy == frozenset()
    finally:
        monitor.stop()


def test_a_reset_xid_waits_for_nvml_to_show_the_reset() -> None:
    nvml, clock = FakeNvml(["GPU-0", "GPU-1"]), Clock()
    nvml.volatile_ecc["GPU-1"] = 2
    monitor, reports = start_monitor(nvml, settings=Settings(after=60), clock=clock)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-1"], 0x8, 95))
        assert reports.next()[0] == {"GPU-1"}
        clock.now += 3600  # time alone never brings it back
        assert not eventually(lambda: not reports.unhealthy, timeout=0.3)
        nvml.volatile_ecc["GPU-1"] = 0  # a GPU reset zeroes the volatile count
        clock.now += 1
        assert wait_for(reports, "recovered")[0] == {"GPU-1"}
    finally:
        monitor.stop()


def test_a_lost_gpu_stays_down_while_lost_and_returns_once_nvml_answers(tmp_path: Path) -> None:
    nvml, clock = FakeNvml(["GPU-0", "GPU-1"]), Clock()
    monitor, reports = start_monitor(nvml, settings=Settings(after=30), clock=clock, state_dir=str(tmp_path))
    assert monitor.start()
    try:
        nvml.lost.add("GPU-1")
        nvml.events.put(NVMLError(nvml.NVML_ERROR_GPU_IS_LOST))
        assert reports.next()[0] == {"GPU-1"}
        assert eventually(lambda: "GPU-1" in (read_state(str(tmp_path)) or {}).get("gpus", {}))
        record = read_state(str(tmp_path))
        assert record is not None and record["gpus"]["GPU-1"]["state"] == "needs-reset"
        assert record["writer"] == "nvidia-device-plugin" and record["gpus"]["GPU-1"]["devices"] == ["GPU-1"]
        clock.now += 100
        assert not eventually(lambda: not reports.unhealthy, timeout=0.3)
        nvml.lost.discard("GPU-1")
        clock.now += 1
        assert wait_for(reports, "recovered")[0] == {"GPU-1"}
        assert eventually(lambda: (read_state(str(tmp_path)) or {}).get("gpus") == {})
    finally:
        monitor.stop()


def test_a_pending_row_remap_holds_the_gpu_until_cleared() -> None:
    nvml, clock = FakeNvml(["GPU-0", "GPU-1"]), Clock()
    monitor, reports = start_monitor(nvml, settings=Settings(after=10), clock=clock)
    assert monitor.start()
    try:
        nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 63))
        assert reports.next()[0] == {"GPU-0"}
        nvml.remap_pending.add("GPU-0")
        clock.now += 20
        _devices, reason = wait_for(reports, "blocked")
        assert reason == "a row remapping is pending (applied at the next GPU reset)"
        clock.now += 100
        assert not eventually(lambda: not reports.unhealthy, timeout=0.3)
        nvml.remap_pending.clear()
        clock.now += 1
        assert wait_for(reports, "recovered")[0] == {"GPU-0"}
    finally:
        monitor.stop()


def test_a_clear_request_brings_a_flapping_gpu_back(tmp_path: Path) -> None:
    nvml, clock = FakeNvml(["GPU-0", "GPU-1"]), Clock()
    monitor, reports = start_monitor(nvml, settings=Settings(after=1, flap_limit=1), clock=clock,
                                     state_dir=str(tmp_path))
    assert monitor.start()
    try:
        for _ in range(2):
            nvml.events.put(Event(nvml.handles["GPU-0"], 0x8, 94))
            reports.next()
            clock.now += 5
            if reports.kinds[-1] != "held":
                wait_for(reports, "recovered")
        assert reports.kinds[-1] == "held"
        clock.now += 3600 * 2
        assert not eventually(lambda: not reports.unhealthy, timeout=0.3)
        request_clear(str(tmp_path), ["GPU-0"])
        clock.now += 1
        assert wait_for(reports, "cleared")[0] == {"GPU-0"}
        assert not (tmp_path / "clear" / "GPU-0").exists()
    finally:
        monitor.stop()
