"""The Recorder words Node Events and hands them to the process's one writer."""

from __future__ import annotations

from nvdp.daemon.report.recording import Recorder


class Writer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.uids: list[str] = []
        self.closed = False

    def record(self, event_type: str, reason: str, message: str) -> None:
        self.sent.append((event_type, reason, message))

    def node_seen(self, uid: str) -> None:
        self.uids.append(uid)

    def close(self, timeout: float = 2.0) -> None:
        self.closed = True


def test_every_event_of_a_process_goes_to_its_one_writer() -> None:
    writer = Writer()
    recorder = Recorder(writer)
    recorder.config_refused("flags.migStrategy: 'sometimes' is not one of none, single, mixed\n  line 3", 1.0)
    recorder.config_applied("/etc/cfg", "added nvidia.com/gpu", True, 2.0)
    recorder.config_applied("/etc/cfg", "unchanged nvidia.com/gpu", False, 3.0)  # nothing changed: no Event
    recorder.config_refused("per-node config reports its own", 4.0, notify=False)
    recorder.health_changed("down", "GPU-0",
                            "GPU-0: XID 79 (GPU has fallen off the bus); it needs a GPU reset")
    recorder.health_changed("recovered", "GPU-0", "GPU-0 is healthy again")
    recorder.event("InvalidConfig", "config entry 'x' is invalid")
    recorder.event("ConfigApplied", "now serving entry 'y'", warning=False)
    recorder.node_seen("uid-1")
    assert writer.sent == [
        ("Warning", "ConfigRefused", "new configuration refused, the previous one keeps serving: "
         "flags.migStrategy: 'sometimes' is not one of none, single, mixed line 3"),
        ("Normal", "ConfigApplied", "configuration from /etc/cfg applied: added nvidia.com/gpu"),
        ("Warning", "GPUUnhealthy", "GPU-0: XID 79 (GPU has fallen off the bus); it needs a GPU reset"),
        ("Normal", "GPUHealthy", "GPU-0 is healthy again"),
        ("Warning", "InvalidConfig", "config entry 'x' is invalid"),
        ("Normal", "ConfigApplied", "now serving entry 'y'"),
    ]
    assert writer.uids == ["uid-1"]
    recorder.close()
    assert writer.closed
    recorder.event("InvalidConfig", "after close: nowhere")  # the writer is gone; no error
    assert len(writer.sent) == 6


def test_only_the_end_of_an_mps_wait_is_news() -> None:
    writer = Writer()
    recorder = Recorder(writer)
    recorder.mps_ready("nvidia.com/gpu", True)
    recorder.mps_ready("nvidia.com/gpu", False, "label the node")
    recorder.mps_ready("nvidia.com/gpu", True)
    recorder.mps_ready("nvidia.com/gpu", True)
    assert [reason for _, reason, _ in writer.sent] == ["MPSDaemonNotReady", "MPSDaemonReady"]


def test_without_a_writer_events_go_nowhere_and_metrics_stay_off() -> None:
    recorder = Recorder()
    recorder.event("InvalidConfig", "nobody listens")
    recorder.allocated("nvidia.com/gpu", 1)
    recorder.xid("GPU-x", 79, "critical")
    assert not recorder.metrics_enabled
