"""The "a, b and N more" wording of long lists."""

from __future__ import annotations

from nvdp.text import short_list


def test_a_long_list_shows_its_first_items_and_counts_the_rest() -> None:
    assert short_list([]) == ""
    assert short_list(["a", "b"]) == "a, b"
    assert short_list(list("abcd")) == "a, b, c, d"
    assert short_list(list("abcdefg")) == "a, b, c, d and 3 more"
    assert short_list(list("abcdefg"), limit=2) == "a, b and 5 more"
    assert short_list(iter("abc"), limit=2) == "a, b and 1 more"


def test_the_total_counts_items_the_caller_did_not_word() -> None:
    assert short_list(["a", "b"], limit=2, total=10000) == "a, b and 9998 more"
    assert short_list(["a", "b"], limit=4, total=2) == "a, b"
