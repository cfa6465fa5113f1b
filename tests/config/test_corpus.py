"""The config corpus: every file under valid/ loads; every file under invalid/ fails with exactly
the problems listed in its .expected file (one per line, in order)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.config.loader import ConfigError, load_config_text

HERE = Path(__file__).parent
VALID = sorted(p for p in (HERE / "valid").iterdir() if p.suffix in (".yaml", ".json"))
INVALID = sorted(p for p in (HERE / "invalid").iterdir() if p.suffix in (".yaml", ".json"))


def test_corpus_is_not_empty() -> None:
    assert len(VALID) >= 10
    assert len(INVALID) >= 10
    for path in INVALID:
        assert path.with_suffix(".expected").exists(), f"{path.name} has no .expected file"


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_config_loads(path: Path) -> None:
    config = load_config_text(path.read_bytes(), path.name, env={})
    assert config.source == path.name
    assert config.version == "v1"


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_config_lists_every_problem(path: Path) -> None:
    expected = path.with_suffix(".expected").read_text().splitlines()
    with pytest.raises(ConfigError) as caught:
        load_config_text(path.read_bytes(), path.name, env={})
    assert [str(issue) for issue in caught.value.issues] == expected
