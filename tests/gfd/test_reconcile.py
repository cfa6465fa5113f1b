"""Label ownership and the no-write-in-steady-state rule."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest

from nvdp.config.loader import load_config_text
from nvdp.gfd.labels import HostFacts, gfd_labels
from nvdp.gfd.publish import FileOutput
from nvdp.gfd.reconcile import apply_changes, label_changes, owns
from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile
from nvdp.plan import plan

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"

N = "nvidia.com/"
WANTED = {N + "gpu.product": "Tesla-T4", N + "gpu.count": "1", N + "mps.capable": "false"}
FOREIGN = {
    "kubernetes.io/hostname": "n1",
    N + "device-plugin.config": "mps",  # the user's config selector
    N + "gpu.present": "true",  # the presence check's (or the GPU operator's)
    N + "gpu.deploy.driver": "true",  # the GPU operator's
    N + "custom": "x",
}


@pytest.mark.parametrize(
    "key",
    [
        N + "gfd.timestamp",
        N + "cuda.driver.rev",
        N + "cuda.driver-version.full",
        N + "cuda.runtime-version.minor",
        N + "gpu.product",
        N + "gpu.replicas",
        N + "gpu.sharing-strategy",
        N + "gpu.engines.ofa",
        N + "gpu.slices.gi",
        N + "gpu.compute.major",
        N + "gpu.machine",
        N + "gpu.mode",
        N + "mig.capable",
        N + "mig.strategy",
        N + "mps.capable",
        N + "mig-1g.10gb.me.count",
        N + "mig-3g.40gb.multiprocessors",
        N + "mig-1g.24gb-me.count",  # Blackwell's profile suffixes
        N + "mig-1g.24gb-me.engines.ofa",
        N + "mig-1g.24gb.me.all.product",
        N + "mig-1g.24gb.gfx.slices.ci",
    ],
)
def test_owned_keys(key: str) -> None:
    assert owns(key)


@pytest.mark.parametrize("key", sorted(FOREIGN))
def test_foreign_keys_are_not_owned(key: str) -> None:
    assert not owns(key)


def test_first_pass_sets_everything_with_a_timestamp() -> None:
    changes = label_changes(FOREIGN, WANTED, 1000)
    assert changes == {**WANTED, N + "gfd.timestamp": "1000"}
    assert apply_changes(FOREIGN, changes) == {**FOREIGN, **WANTED, N + "gfd.timestamp": "1000"}


def test_steady_state_writes_nothing_even_as_time_passes() -> None:
    node = {**FOREIGN, **WANTED, N + "gfd.timestamp": "1000"}
    assert label_changes(node, WANTED, 5000) == {}


def test_a_change_restamps_and_stale_labels_go() -> None:
    node = {**FOREIGN, **WANTED, N + "mig-1g.10gb.count": "7", N + "gfd.timestamp": "1000"}
    wanted = {**WANTED, N + "mps.capable": "true"}
    changes = label_changes(node, wanted, 2000)
    assert changes == {N + "mps.capable": "true", N + "mig-1g.10gb.count": None, N + "gfd.timestamp": "2000"}
    after = apply_changes(node, changes)
    assert {k: v for k, v in after.items() if k in FOREIGN} == FOREIGN
    assert after[N + "mps.capable"] == "true"
    assert N + "mig-1g.10gb.count" not in after


def test_no_timestamp_removes_ours() -> None:
    node = {**WANTED, N + "gfd.timestamp": "1000"}
    assert label_changes(node, WANTED, None) == {N + "gfd.timestamp": None}
    assert label_changes(WANTED, WANTED, None) == {}


def test_no_gpus_any_more_removes_all_owned_labels() -> None:
    node = {**FOREIGN, **WANTED, N + "gfd.timestamp": "1000"}
    changes = label_changes(node, {}, 2000)
    assert apply_changes(node, changes) == FOREIGN


def test_blackwell_me_profiles_settle_and_go_after_a_layout_change(tmp_path: Path) -> None:
    # "1g.24gb-me" gives keys like nvidia.com/mig-1g.24gb-me.count: once they were not owned, so
    # every pass rewrote them and a new layout left them behind.
    inventory = load_profile(PROFILES / "rtx-pro-6000-mig-me.yaml")
    config = load_config_text("version: v1\nflags: {migStrategy: mixed}\n", "test.yaml", env={})

    def wanted(inv: Inventory) -> dict[str, str]:
        return gfd_labels(inv, plan(config, inv), "mixed", HostFacts())

    first = wanted(inventory)
    me_keys = {k for k in first if k.startswith(N + "mig-1g.24gb-me.")}
    assert len(me_keys) == 13 and first[N + "mig-1g.24gb-me.count"] == "4"
    assert first[N + "mig-1g.24gb.me.all.count"] == "1"
    output = FileOutput(str(tmp_path / "gfd"))
    assert output.publish(first, 1000)
    assert output.publish(first, 2000) == {}  # the second pass writes nothing
    assert FileOutput(str(tmp_path / "gfd")).publish(first, 3000) == {}  # nor does a restart

    # GPU 0 re-laid out as 2x 2g.48gb: every 1g.24gb-me label goes
    gpu0 = inventory.gpus[0]
    relaid = tuple(msgspec.structs.replace(m, profile="2g.48gb") for m in gpu0.mig_devices[:2])
    inventory = msgspec.structs.replace(
        inventory, gpus=(msgspec.structs.replace(gpu0, mig_devices=relaid), *inventory.gpus[1:])
    )
    second = wanted(inventory)
    changes = output.publish(second, 4000)
    assert {k for k, v in changes.items() if v is None} == me_keys
    assert not {k for k in (tmp_path / "gfd").read_text().split("=") if "1g.24gb-me" in k}
    assert output.publish(second, 5000) == {}


def test_contested_writes_back_off_then_start_over(caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.gfd.contest import ContestedWrites

    caplog.set_level(logging.INFO, logger="nvdp.gfd")
    pace = ContestedWrites("n1", (1.0, 4.0))
    mine = {N + "gpu.product": "Tesla-T4", N + "gfd.timestamp": "1"}
    assert pace.contested(mine) == []  # never written: a plain write
    pace.wrote(mine, [], 0.0)
    again = {N + "gpu.product": "Tesla-T4", N + "gfd.timestamp": "2"}  # someone changed it back
    assert pace.contested(again) == [N + "gpu.product"]  # the timestamp does not count
    assert pace.contested({N + "gpu.product": "Tesla-T4-SHARED"}) == []  # a new value is no contest

    waits: list[float] = []
    now = 10.0
    for _ in range(5):  # each contested write goes out as soon as it may
        now += pace.wait_s(now)
        pace.wrote(again, pace.contested(again), now)
        waits.append(pace.wait_s(now))
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]  # the first at once, then doubling up to the most
    assert [r.levelname for r in caplog.records if "someone else" in r.message] == ["INFO", "WARNING"]
    assert "another labeller" in caplog.text and "rolling update" in caplog.text
    assert pace.wait_s(now + 9) == 0.0  # quiet for twice the most: it starts over
    pace.wrote(again, pace.contested(again), now + 9)
    assert pace.wait_s(now + 9) == 1.0
