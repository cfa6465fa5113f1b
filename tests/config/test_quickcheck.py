"""The quick schema check agrees with jsonschema whenever it gives an answer, and answers for the corpus."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdp.config import validate
from nvdp.config.loader import load_config_text
from nvdp.config.quickcheck import verdict
from nvdp.config.schema import validator

HERE = Path(__file__).parent
VALID = sorted(p for p in (HERE / "valid").iterdir() if p.suffix in (".yaml", ".json"))
INVALID = sorted(p for p in (HERE / "invalid").iterdir() if p.suffix in (".yaml", ".json"))
ENUM_WORDS = ["v1", "all", "none", "single", "mixed", "envvar", "volume-mounts", "cdi-annotations",
              "cdi-cri", "uuid", "index", "60s", "1m30s", "infinite", "48,79", "xids", "gpu",
              "nvidia.com/gpu", "GPU-1", "0:1", "packed", "distributed", "", "x" * 70]  # fmt: skip
KEYS = ["version", "flags", "sharing", "resources", "name", "replicas", "rename", "devices", "timeSlicing",
        "mps", "plugin", "migStrategy", "bogus"]  # fmt: skip
VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-2, max_value=200),
        st.floats(min_value=-1, max_value=3),
        st.sampled_from(ENUM_WORDS),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(ENUM_WORDS), inner,
                                                                         max_size=2)),
    max_leaves=6,
)  # fmt: skip


def parse(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def agrees(doc: Any) -> None:
    answer = verdict(doc)
    if answer is not None:
        assert answer == validator().is_valid(doc), doc


def places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += places(item, (*path, index))
    return found


def replaced(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    doc = copy.deepcopy(doc)
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = new
    return doc


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_corpus_loads_without_jsonschema(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("the full validator ran for a valid config")

    monkeypatch.setattr(validate, "validator", refuse)
    assert load_config_text(path.read_bytes(), path.name, env={}).version == "v1"


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_corpus_agrees_with_jsonschema(path: Path) -> None:
    try:
        doc = parse(path)
    except (yaml.YAMLError, json.JSONDecodeError):
        return  # never reaches the schema
    agrees(doc)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data())
def test_changed_corpus_documents_agree_with_jsonschema(path: Path, data: st.DataObject) -> None:
    doc = parse(path)
    where = data.draw(st.sampled_from(places(doc)))
    agrees(replaced(doc, where, data.draw(VALUES)))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data())
def test_documents_with_an_added_key_agree_with_jsonschema(path: Path, data: st.DataObject) -> None:
    doc = parse(path)
    doc = doc if isinstance(doc, dict) else {}
    mappings = [p for p in places(doc) if isinstance(_at(doc, p), dict)]
    key = data.draw(st.sampled_from(KEYS))
    _at(doc, data.draw(st.sampled_from(mappings)))[key] = data.draw(VALUES)
    agrees(doc)


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@pytest.mark.slow
def test_loading_a_valid_config_does_not_import_jsonschema(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes((HERE / "valid" / "time-slicing.yaml").read_bytes())
    code = (
        "import sys\n"
        "from nvdp.config.loader import load_config\n"
        f"load_config({str(config)!r}, {{}})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jsonschema', 'referencing', 'rpds')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_loading_without_a_config_file_needs_no_yaml_parser() -> None:
    code = (
        "import sys\n"
        "from nvdp.config.loader import load_config\n"
        "print(load_config(None, {}).source)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('yaml', 'jsonschema')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["defaults", "[]"]
