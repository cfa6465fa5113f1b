"""Label ownership and the no-write-in-steady-state rule."""

from __future__ import annotations

import pytest

from nvdp.gfd.reconcile import apply_changes, label_changes, owns

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
