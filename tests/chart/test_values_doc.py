"""Every value is commented in values.yaml and listed, with that comment, in the chart README's table.

The rules (scripts/chart_values.py says them in full): a *leaf* is a key whose schema is not a section
(an object listing its keys), so a scalar, a list or a free-form map such as `config.map` or `affinity`
is one leaf and one row. A leaf's comment is the `#` block directly above its key; the first paragraph
of it is the row's description.
"""

from __future__ import annotations

import re
from typing import Any

import chart_values
import pytest
import yaml
from chart_helm import CHART_DIR, render

loader = pytest.importorskip("nvdp.config.loader", reason="the plugin's config loader is not importable")

VALUES_TEXT = (CHART_DIR / "values.yaml").read_text(encoding="utf-8")
README_TEXT = (CHART_DIR / "README.md").read_text(encoding="utf-8")
# Listed by the schema only so that validation.yaml can refuse it with the fix (helm --namespace).
NOT_A_VALUE = {"namespace"}


@pytest.fixture(scope="module")
def leaves() -> list[chart_values.Leaf]:
    return chart_values.leaves(VALUES_TEXT, chart_values.load_schema())


def readme_rows() -> list[tuple[str, str, str]]:
    """The README values table: (value, default, description) per row, as written."""
    start = README_TEXT.index(chart_values.TABLE_START)
    end = README_TEXT.index(chart_values.TABLE_END)
    rows = []
    for line in README_TEXT[start:end].splitlines()[3:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 3, f"not a table row of three cells: {line}"
        value = cells[0].strip("`")
        rows.append((value, cells[1], cells[2]))
    return rows


def test_every_leaf_of_values_yaml_has_a_comment_in_one_style(leaves: list[chart_values.Leaf]) -> None:
    uncommented = [leaf.path for leaf in leaves if not leaf.description]
    assert not uncommented, f"values without a comment on the lines above them: {uncommented}"
    # `# --` heads a section or a group of values; a value's own comment is plain prose.
    headed = [leaf.path for leaf in leaves if leaf.description.startswith("--")]
    assert not headed, f"values whose comment is a section heading (`# --`), not their own: {headed}"


def test_the_readme_lists_every_leaf_once_with_its_comment(leaves: list[chart_values.Leaf]) -> None:
    rows = readme_rows()
    assert [row[0] for row in rows] == [leaf.path for leaf in leaves], (
        "the README values table is not one row per leaf of values.yaml, in its order; "
        "run `python scripts/chart_values.py`"
    )
    for (path, _, description), leaf in zip(rows, leaves, strict=True):
        assert description == chart_values.markdown(leaf.description), (
            f"{path}: the README's description differs from the comment above it in values.yaml; "
            "run `python scripts/chart_values.py`"
        )


def test_generated_files_are_current() -> None:
    stale = chart_values.stale_files(write=False)
    assert not stale, (
        f"{[str(p.relative_to(chart_values.ROOT)) for p in stale]} differ from values.yaml and "
        "values.schema.json; run `python scripts/chart_values.py`"
    )


def test_every_key_the_schema_takes_is_in_values_yaml(leaves: list[chart_values.Leaf]) -> None:
    """So that every accepted value has a default, a comment and a row."""
    in_values = {leaf.path for leaf in leaves}
    sections = chart_values.value_key_paths(chart_values.load_schema())
    missing = []
    for section, keys in sections.items():
        if "[]" in section:
            continue  # the keys of list items (dra.sharingClasses[]) are described by the list's comment
        for key in keys:
            path = f"{section}.{key}" if section else key
            if path not in in_values and path not in sections and path not in NOT_A_VALUE:
                missing.append(path)
    assert not missing, f"values the schema accepts that values.yaml does not have: {missing}"


SAMPLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"$ref": chart_values.UNKNOWN_KEY_REF},
    "properties": {
        "open": {"type": "object"},
        "list": {"type": "array"},
        "section": {
            "type": "object",
            "additionalProperties": {"$ref": chart_values.UNKNOWN_KEY_REF},
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        },
    },
}


def test_leaves_are_read_with_the_comment_directly_above_them() -> None:
    text = (
        "# File header, apart.\n"
        "\n"
        "# A map passed on whole: one leaf.\n"
        "# Its second line.\n"
        "#\n"
        "# Details for the file only.\n"
        "open:\n"
        "  nested:\n"
        "    # a comment inside a leaf's value belongs to no value\n"
        "    deep: 1\n"
        "# -- A section heading.\n"
        "section:\n"
        "  # The first.\n"
        "  a: x\n"
        "\n"
        "  b: 2\n"
        "list:\n"
        "- one\n"
        "- two\n"
    )
    found = chart_values.leaves(text, SAMPLE_SCHEMA)
    assert [(leaf.path, leaf.description, leaf.default) for leaf in found] == [
        ("open", "A map passed on whole: one leaf. Its second line.", {"nested": {"deep": 1}}),
        ("section.a", "The first.", "x"),
        ("section.b", "", 2),  # a blank line cuts a value off the comment above it
        ("list", "", ["one", "two"]),
    ]


def test_a_comment_after_a_value_is_refused() -> None:
    with pytest.raises(chart_values.ValuesFileError, match=r"section.a has a comment after its value"):
        chart_values.leaves("section:\n  # A.\n  a: x  # trailing\n", SAMPLE_SCHEMA)


def test_cells_keep_tags_and_pipes_from_markdown() -> None:
    assert chart_values.markdown("in <root-dir> and `<dir>/x` | y") == "in \\<root-dir> and `<dir>/x` \\| y"


def commented_example(leaf: chart_values.Leaf) -> dict[str, Any]:
    """The values file fragment in a leaf's comment: its indented lines after the first paragraph."""
    block = [line for line in leaf.comment if line.startswith("  ")]
    assert block, f"no indented example in the comment of {leaf.path}"
    example: dict[str, Any] = yaml.safe_load("\n".join(line[2:] for line in block))
    return example


def readme_config_example() -> dict[str, Any]:
    section = README_TEXT[README_TEXT.index("## Config files") :]
    match = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    assert match is not None, "no YAML example in the README's Config files section"
    example: dict[str, Any] = yaml.safe_load(match.group(1))
    return example


def test_the_time_slicing_examples_install_and_share_every_gpu_four_times(
    leaves: list[chart_values.Leaf],
) -> None:
    config_map = next(leaf for leaf in leaves if leaf.path == "config.map")
    examples = {"values.yaml": commented_example(config_map), "README.md": readme_config_example()}
    assert examples["values.yaml"] == examples["README.md"]
    for where, values in examples.items():
        rendered = render(values)
        entries = {k: v for cm in rendered.find("ConfigMap") for k, v in cm["data"].items()}
        assert list(entries) == ["default"], where
        config = loader.load_config_text(entries["default"], f"{where}: config.map.default")
        time_slicing = config.sharing.time_slicing
        assert time_slicing is not None, where
        (resource,) = time_slicing.resources
        assert (resource.name, resource.replicas) == ("nvidia.com/gpu", 4), where
