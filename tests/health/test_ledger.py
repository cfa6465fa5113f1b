"""The health rules (nvdp.health.ledger): when a GPU that is down may serve again."""

from __future__ import annotations

from nvdp.health.ledger import Cause, Check, Ledger, Settings
from nvdp.health.xids import Remedy, describe, xid_info

T0 = 1_000_000.0
XID94 = Cause("XID 94 (contained ECC error)", Remedy.WAIT, 94)
XID95 = Cause("XID 95 (uncontained ECC error)", Remedy.RESET, 95)
FINE = Check()


def test_the_catalogue_sorts_xids_by_what_brings_the_gpu_back() -> None:
    assert xid_info(94).remedy is Remedy.WAIT  # RESTART_APP
    assert xid_info(43).remedy is Remedy.WAIT  # IGNORE
    assert xid_info(63).remedy is Remedy.WAIT  # IGNORE: the pending remap is what holds it
    for xid in (48, 62, 64, 79, 95, 109, 119, 120, 140):
        assert xid_info(xid).remedy is Remedy.RESET, xid
    assert xid_info(9999).remedy is Remedy.RESET  # unknown: kept down until NVML shows a reset
    assert describe(79) == "XID 79 (GPU has fallen off the bus)"


def test_a_transient_fault_returns_after_the_quiet_period_once_nvml_reports_it_fine() -> None:
    ledger = Ledger(Settings(after=300))
    [down] = ledger.fault("GPU-0", {"GPU-0"}, XID94, T0)
    assert down.kind == "down" and ledger.unhealthy == {"GPU-0"}
    assert "comes back by itself after 5m without a critical XID" in down.message
    assert ledger.due(T0 + 299) == []
    assert ledger.checked("GPU-0", FINE, T0 + 299) == []
    assert ledger.due(T0 + 300) == ["GPU-0"]
    [back] = ledger.checked("GPU-0", FINE, T0 + 300)
    assert back.kind == "recovered" and back.devices == {"GPU-0"}
    assert back.message == (
        "GPU-0 is healthy again: no critical XID for 5m and NVML reports it fine "
        "(it went down on XID 94 (contained ECC error))"
    )
    assert ledger.unhealthy == frozenset()


def test_every_new_xid_starts_the_quiet_period_again_and_adds_devices() -> None:
    ledger = Ledger(Settings(after=60))
    ledger.fault("GPU-0", {"MIG-1"}, XID94, T0)
    assert ledger.fault("GPU-0", {"MIG-1"}, XID94, T0 + 50) == []  # nothing new to tell
    [more] = ledger.fault("GPU-0", {"MIG-2"}, XID94, T0 + 55)
    assert more.devices == {"MIG-2"} and "MIG-2 on GPU-0" in more.message
    assert ledger.checked("GPU-0", FINE, T0 + 100) == []  # 45 s after the last XID
    [back] = ledger.checked("GPU-0", FINE, T0 + 115)
    assert back.devices == {"MIG-1", "MIG-2"}
    assert ledger.faults() == {}


def test_a_reset_fault_never_returns_on_time_alone() -> None:
    ledger = Ledger(Settings(after=60))
    [down] = ledger.fault("GPU-0", {"GPU-0"}, XID95, T0)
    ledger.baseline("GPU-0", Check(volatile_ecc=3))
    assert "needs a GPU reset (`nvidia-smi -r -i GPU-0`" in down.message
    assert ledger.due(T0 + 1) == ["GPU-0"]  # re-checked all along, to see the reset
    assert ledger.checked("GPU-0", Check(volatile_ecc=3), T0 + 86400) == []
    assert ledger.unhealthy == {"GPU-0"}
    [back] = ledger.checked("GPU-0", Check(volatile_ecc=0), T0 + 86401)  # a reset zeroed the count
    assert back.kind == "recovered" and "NVML shows it was reset" in back.message


def test_a_reset_seen_as_the_gpu_going_away_and_coming_back() -> None:
    ledger = Ledger(Settings(after=60))
    ledger.fault("GPU-0", {"GPU-0"}, XID95, T0)  # no ECC count on this board
    [blocked] = ledger.checked("GPU-0", Check(answers=False, lost=True), T0 + 10)
    assert blocked.kind == "blocked" and blocked.reason == "the GPU is lost (fallen off the bus)"
    assert ledger.checked("GPU-0", Check(answers=False, lost=True), T0 + 11) == []  # said once
    assert ledger.checked("GPU-0", FINE, T0 + 30) == []  # back, but not yet quiet for 60 s
    [back] = ledger.checked("GPU-0", FINE, T0 + 61)
    assert back.kind == "recovered"


def test_a_problem_found_by_a_recheck_holds_even_a_transient_fault_until_a_reset() -> None:
    ledger = Ledger(Settings(after=10))
    ledger.fault("GPU-0", {"GPU-0"}, XID94, T0)
    for check, words in (
        (Check(remap_pending=True), "a row remapping is pending"),
        (Check(retirement_pending=True), "a page retirement is pending"),
        (Check(recovery_action=1), "the driver asks for a GPU reset"),
        (Check(remap_failed=True), "a row remapping failed (the GPU needs service)"),
        (Check(answers=False, error="Unknown Error"), "NVML does not answer for it (Unknown Error)"),
    ):
        [blocked] = ledger.checked("GPU-0", check, T0 + 20)
        assert blocked.reason.startswith(words), blocked.reason
        assert ledger.state(ledger.faults()["GPU-0"]) == "needs-reset"
    [back] = ledger.checked("GPU-0", FINE, T0 + 21)
    assert back.kind == "recovered"


def test_a_baseline_that_shows_a_problem_is_the_first_half_of_a_reset() -> None:
    ledger = Ledger(Settings(after=10))
    ledger.fault("GPU-0", {"GPU-0"}, Cause("GPU is lost", Remedy.RESET), T0)
    ledger.baseline("GPU-0", Check(answers=False, lost=True))
    assert ledger.faults()["GPU-0"].blocked == "the GPU is lost (fallen off the bus)"
    assert ledger.checked("GPU-0", Check(answers=False, lost=True), T0 + 20) == []  # already said
    assert ledger.checked("GPU-0", FINE, T0 + 21)[0].kind == "recovered"


def test_more_downs_than_the_flap_limit_within_an_hour_hold_the_gpu() -> None:
    ledger = Ledger(Settings(after=1, flap_limit=2))
    for n in range(2):
        ledger.fault("GPU-0", {"GPU-0"}, XID94, T0 + n * 100)
        assert ledger.checked("GPU-0", FINE, T0 + n * 100 + 5)[0].kind == "recovered"
    [held] = ledger.fault("GPU-0", {"GPU-0"}, XID94, T0 + 300)
    assert held.kind == "held"
    assert ("went Unhealthy 3 times within the last hour (XID 94 (contained ECC error); XID 94 "
            "(contained ECC error); XID 94 (contained ECC error)), more than the limit of 2") in held.message
    assert "`nvdp health clear GPU-0`" in held.message
    assert ledger.due(T0 + 10_000) == [] and ledger.checked("GPU-0", FINE, T0 + 10_000) == []
    [cleared] = ledger.clear(["GPU-0", "GPU-9"], T0 + 10_001)
    assert cleared.kind == "cleared" and ledger.unhealthy == frozenset()
    # The downs are forgotten with the clear: the next fault is an ordinary one.
    assert ledger.fault("GPU-0", {"GPU-0"}, XID94, T0 + 10_002)[0].kind == "down"


def test_downs_older_than_an_hour_do_not_count() -> None:
    ledger = Ledger(Settings(after=1, flap_limit=1))
    ledger.fault("GPU-0", {"GPU-0"}, XID94, T0)
    ledger.checked("GPU-0", FINE, T0 + 2)
    assert ledger.fault("GPU-0", {"GPU-0"}, XID94, T0 + 3601)[0].kind == "down"


def test_with_recovery_off_nothing_comes_back_and_nothing_is_restored() -> None:
    ledger = Ledger(Settings(after=None))
    [down] = ledger.fault("GPU-0", {"GPU-0"}, XID94, T0)
    assert "it stays down until the plugin restarts" in down.message
    assert ledger.due(T0 + 1e9) == [] and ledger.checked("GPU-0", FINE, T0 + 1e9) == []
    assert ledger.state(ledger.faults()["GPU-0"]) == "recovery-off"
    assert Ledger(Settings(after=None)).restore(ledger.record(), T0) == []


def test_the_record_brings_faults_and_downs_back_after_a_restart() -> None:
    ledger = Ledger(Settings(after=60, flap_limit=1))
    ledger.fault("GPU-0", {"MIG-1"}, XID95, T0)
    ledger.baseline("GPU-0", Check(volatile_ecc=4))
    ledger.fault("GPU-1", {"GPU-1"}, XID94, T0)
    ledger.checked("GPU-1", FINE, T0 + 61)
    record = ledger.record()
    assert record["gpus"]["GPU-0"]["state"] == "needs-reset" and record["gpus"]["GPU-0"]["devices"] == [
        "MIG-1"
    ]
    again = Ledger(Settings(after=60, flap_limit=1))
    [taken] = again.restore(record, T0 + 100)
    assert taken.gpu == "GPU-0" and taken.baseline_ecc == 4 and again.unhealthy == {"MIG-1"}
    assert again.checked("GPU-0", Check(volatile_ecc=0), T0 + 200)[0].kind == "recovered"
    # GPU-1's down is remembered: one more within the hour is over the limit of 1.
    assert again.fault("GPU-1", {"GPU-1"}, XID94, T0 + 300)[0].kind == "held"
    # Downs older than the window are dropped on the way in.
    later = Ledger(Settings(after=60, flap_limit=1))
    later.restore(record, T0 + 4000)
    assert later.fault("GPU-1", {"GPU-1"}, XID94, T0 + 4001)[0].kind == "down"


def test_a_baseline_given_after_the_fault_is_kept_once_and_can_say_a_reset_is_needed() -> None:
    ledger = Ledger(Settings(after=10))
    ledger.fault("GPU-0", {"GPU-0"}, XID95, T0)
    assert ledger.baseline("GPU-0", Check(volatile_ecc=2)) == []
    assert ledger.baseline("GPU-0", Check(volatile_ecc=9)) == []  # the first one counts
    assert ledger.faults()["GPU-0"].baseline_ecc == 2
    assert ledger.checked("GPU-0", Check(volatile_ecc=0), T0 + 11)[0].kind == "recovered"
    ledger.fault("GPU-1", {"GPU-1"}, XID94, T0)
    [blocked] = ledger.baseline("GPU-1", Check(remap_pending=True))
    assert blocked.kind == "blocked" and ledger.state(ledger.faults()["GPU-1"]) == "needs-reset"
