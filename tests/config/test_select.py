"""Which entry a node gets: NVIDIA's config-manager order (label, default, fallbacks), and the entries
directory as the kubelet lays out a ConfigMap volume."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.config.entries import directory_fingerprint, list_entries
from nvdp.config.select import (
    Selection,
    SelectionError,
    UnknownEntry,
    parse_fallbacks,
    select_entry,
    select_for_labels,
)

ENTRIES = ("default", "mps", "ts")


def test_the_label_wins_over_everything() -> None:
    assert select_entry(ENTRIES, "mps", "ts", ("named",)) == Selection("mps", "label")


def test_an_empty_label_counts_as_unset() -> None:
    assert select_entry(ENTRIES, "", "ts") == Selection("ts", "config.default")


def test_a_label_naming_a_missing_entry_is_an_error_listing_the_entries() -> None:
    with pytest.raises(UnknownEntry) as err:
        select_entry(ENTRIES, "h100", "ts")
    assert "names config 'h100', which does not exist (entries: default, mps, ts)" in str(err.value)


def test_the_default_must_exist() -> None:
    with pytest.raises(UnknownEntry, match=r"config\.default"):
        select_entry(ENTRIES, None, "gone")


@pytest.mark.parametrize(("entries", "fallbacks", "expected"), [
    (ENTRIES, ("named", "single"), Selection("default", "fallback named")),
    (("only",), ("named", "single"), Selection("only", "fallback single")),
    (("a", "b"), ("named", "single", "empty"), Selection(None, "fallback empty")),
    (("default",), ("single", "named"), Selection("default", "fallback single")),
    ((), ("empty",), Selection(None, "fallback empty")),
])
def test_fallbacks_are_tried_in_order(entries: tuple[str, ...], fallbacks: tuple[str, ...],
                                      expected: Selection) -> None:
    assert select_entry(entries, None, None, fallbacks) == expected


def test_when_every_fallback_fails_the_message_says_what_to_do() -> None:
    with pytest.raises(SelectionError, match="all fallbacks failed") as err:
        select_entry(("a", "b"), None, None, ("named", "single"))
    assert "config.default" in str(err.value) and "entries: a, b" in str(err.value)


def test_fallback_strategies_parse_like_the_env_variable() -> None:
    assert parse_fallbacks("named, single") == ("named", "single")
    assert parse_fallbacks(None) == ("named", "single")
    assert parse_fallbacks("") == ()
    assert parse_fallbacks(["empty"]) == ("empty",)
    with pytest.raises(SelectionError, match="unknown fallback strategy: nmaed"):
        parse_fallbacks("nmaed,single")


def test_labels_mapping_and_a_custom_label_key() -> None:
    labels = {"nvidia.com/device-plugin.config": "ts", "example.com/cfg": "mps"}
    assert select_for_labels(ENTRIES, labels, None).entry == "ts"
    assert select_for_labels(ENTRIES, labels, None, label_name="example.com/cfg").entry == "mps"
    assert select_for_labels(ENTRIES, None, "ts").entry == "ts"


def configmap_volume(root: Path, entries: dict[str, str], stamp: str = "1") -> None:
    data = root / f"..2026_{stamp}"
    data.mkdir(parents=True)
    for name, text in entries.items():
        (data / name).write_text(text)
    link = root / "..data_tmp"
    link.symlink_to(data.name)
    link.rename(root / "..data")
    for name in entries:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def test_entries_are_the_files_of_a_configmap_volume(tmp_path: Path) -> None:
    configmap_volume(tmp_path, {"ts": "version: v1\n", "mps": "version: v1\n"})
    (tmp_path / "subdir").mkdir()
    assert list_entries(tmp_path) == ("mps", "ts")


def test_the_fingerprint_changes_on_the_kubelets_atomic_swap(tmp_path: Path) -> None:
    configmap_volume(tmp_path, {"ts": "version: v1\n"})
    before = directory_fingerprint(tmp_path)
    assert directory_fingerprint(tmp_path) == before
    configmap_volume(tmp_path, {"ts": "version: v1\nflags: {migStrategy: none}\n"}, stamp="2")
    assert directory_fingerprint(tmp_path) != before
    assert directory_fingerprint(tmp_path / "missing").startswith("unreadable")
