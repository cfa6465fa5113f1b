"""The pool generation the slice publisher writes (nvdp.dra.pool.publish.next_generation); the publisher
against a real API server is in tests/kube/test_dra_publish_api.py."""

from __future__ import annotations

from nvdp.dra.pool.publish import MAX_GENERATION, next_generation


def test_the_next_generation_is_above_its_own_and_every_slice_found() -> None:
    assert next_generation(0, []) == 1
    assert next_generation(3, [1, 2]) == 4
    assert next_generation(3, [7, 2]) == 8  # another writer's (or an earlier run's) newer slice


def test_a_generation_at_the_top_of_the_api_range_starts_over() -> None:
    # ResourcePool.generation is an int64: MAX_GENERATION + 1 is refused by the API server.
    assert MAX_GENERATION == 9223372036854775807
    assert next_generation(5, [MAX_GENERATION]) == 1
    assert next_generation(MAX_GENERATION, []) == 1
    assert next_generation(5, [MAX_GENERATION - 1]) == MAX_GENERATION
