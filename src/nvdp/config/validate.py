"""Turn schema violations into ConfigIssues a person can act on.

The rules are the schema's; this module only words them: unknown keys get the closest known key,
oneOf/anyOf failures are narrowed to the form the value was evidently meant to have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from nvdp.config.issues import ConfigIssue, DocPath, format_path, show_value
from nvdp.config.quickcheck import plainly_valid
from nvdp.config.schema import SchemaNode, key_paths, resolve, show_key_path, validator

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

# Document path -> (source name, line or None): where a value came from.
Locate = Callable[[DocPath], tuple[str, "int | None"]]

_TYPE_PHRASES = {
    "boolean": "true or false",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


def schema_issues(doc: object, locate: Locate) -> list[ConfigIssue]:
    if plainly_valid(doc):
        return []  # the usual case, without loading jsonschema into the plugin process
    issues: list[ConfigIssue] = []
    for error in validator().iter_errors(doc):
        issues.extend(_describe(error, locate))
    return issues


def _issue(locate: Locate, path: DocPath, message: str, value: str | None, fix: str | None) -> ConfigIssue:
    source, line = locate(path)
    return ConfigIssue(source, format_path(path), message, line=line, value=value, fix=fix)


def _describe(error: ValidationError, locate: Locate) -> list[ConfigIssue]:
    path: DocPath = tuple(error.absolute_path)
    keyword = error.validator
    node: SchemaNode = error.schema if isinstance(error.schema, dict) else {}
    instance = error.instance
    got = show_value(instance)
    if keyword == "additionalProperties" and isinstance(instance, dict):
        known = node.get("properties", {})
        return [
            _issue(locate, (*path, str(key)), "unknown key", None, suggest_key(path, str(key)))
            for key in instance
            if key not in known
        ]
    if keyword == "required" and isinstance(instance, dict):
        props = node.get("properties", {})
        return [
            _issue(
                locate,
                path,
                f"missing required key '{key}'",
                None,
                f"add {key}: {expected_phrase(props.get(key, {}))}",
            )
            for key in error.validator_value
            if key not in instance
        ]
    if keyword in ("oneOf", "anyOf"):
        meant = _intended_branch(error)
        if meant is not None:
            whole = f"expected {expected_phrase(node)}"
            issues: list[ConfigIssue] = []
            for sub in meant:
                # A value of the right type but not an allowed one: show every accepted form.
                widen = sub.validator in ("const", "enum") and not sub.relative_path
                issues.extend(replace(i, fix=whole) if widen else i for i in _describe(sub, locate))
            return issues
        return [_issue(locate, path, "has the wrong form", got, f"expected {expected_phrase(node)}")]
    messages = {
        "type": "has the wrong type",
        "enum": "is not an allowed value",
        "const": "is not an allowed value",
        "pattern": "is not valid",
        "minimum": f"must be at least {error.validator_value}",
        "maximum": f"must be at most {error.validator_value}",
        "minItems": f"must list at least {error.validator_value} item(s)",
        "minLength": "must not be empty",
        "uniqueItems": "lists the same item twice",
    }
    message = messages.get(str(keyword), error.message)
    if keyword == "not":
        message = _not_message(error.validator_value)
    fix = f"expected {expected_phrase(node)}"
    if keyword == "minItems" and error.validator_value == 1:
        message, fix = "must not be empty", "add at least one entry"
    if keyword == "maximum" and isinstance(node.get("$comment"), str):
        message += f": {node['$comment']}"  # the schema says why the bound is where it is
    return [_issue(locate, path, message, got, fix)]


def _not_message(refused: object) -> str:
    """ "must not be <what the `not` schema describes>" (its description says what it refuses)."""
    described = refused.get("description") if isinstance(refused, dict) else None
    return f"must not be {described}" if isinstance(described, str) else "is not allowed"


def _intended_branch(error: ValidationError) -> list[ValidationError] | None:
    """The errors of the one branch whose type the value has, if exactly one has it."""
    by_branch: dict[int, list[ValidationError]] = {}
    for sub in error.context or ():
        branch = sub.relative_schema_path[0]
        if isinstance(branch, int):
            by_branch.setdefault(branch, []).append(sub)
    matching = [
        subs
        for subs in by_branch.values()
        if not any(s.validator == "type" and not s.relative_path for s in subs)
    ]
    return matching[0] if len(matching) == 1 else None


def expected_phrase(node: SchemaNode, use_title: bool = False) -> str:
    """What a valid value looks like, in words, from the schema node."""
    node = resolve(node)
    if "const" in node:
        return _plain(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(_plain(v) for v in node["enum"])
    branches = node.get("oneOf") or node.get("anyOf")
    if branches:
        return " or ".join(expected_phrase(b, use_title=True) for b in branches)
    if use_title and isinstance(node.get("title"), str) and "pattern" not in node:
        return _lower_first(node["title"])
    if "pattern" in node:
        text = node.get("description") or node.get("title") or f"text matching {node['pattern']}"
        return _lower_first(str(text)).rstrip(".")
    declared = node.get("type", [])
    types = [declared] if isinstance(declared, str) else list(declared)
    phrases = []
    for kind in types:
        phrase = _TYPE_PHRASES.get(kind, kind)
        if kind == "integer" and "minimum" in node and "maximum" in node:
            phrase += f" from {node['minimum']} to {node['maximum']}"
        elif kind == "integer" and "minimum" in node:
            phrase += f" >= {node['minimum']}"
        if kind == "string" and node.get("minLength"):
            phrase = "a non-empty string"
        phrases.append(phrase)
    return " or ".join(phrases) or "a valid value"


def _plain(value: Any) -> str:
    if value == "":
        return '""'
    if isinstance(value, str):
        return value
    return show_value(value)


def _lower_first(text: str) -> str:
    # Keep acronyms ("GPU ...") as they are.
    return text if text[1:2].isupper() else text[:1].lower() + text[1:]


def suggest_key(parent: DocPath, key: str) -> str:
    """ "did you mean <known key path>?" for an unknown key, searching the whole schema."""
    known = key_paths()
    generic_parent = tuple("[]" if isinstance(p, int) else str(p) for p in parent)
    here = (*generic_parent, key)
    same_leaf = [p for p in known if p[-1].lower() == key.lower() and p != here]
    if same_leaf:
        # Closest in the tree first (longest shared prefix), then schema order.
        best = max(same_leaf, key=lambda p: (_shared_prefix(p, generic_parent), -known.index(p)))
        return f"did you mean {_display(best, parent)}?"
    siblings = [p[-1] for p in known if p[:-1] == generic_parent]
    close = _close(key, siblings, 0.6)
    if close is not None:
        return f"did you mean {_display((*generic_parent, close), parent)}?"
    leaves = [p[-1] for p in known]
    close = _close(key, leaves, 0.75)
    if close is not None:
        candidates = [p for p in known if p[-1] == close]
        best = max(candidates, key=lambda p: (_shared_prefix(p, generic_parent), -known.index(p)))
        return f"did you mean {_display(best, parent)}?"
    if siblings:
        return "valid keys here: " + ", ".join(siblings)
    return "remove it"


def _close(word: str, options: Sequence[str], cutoff: float) -> str | None:
    import difflib  # only a config with an unknown key needs it

    lowered = {o.lower(): o for o in options}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[found[0]] if found else None


def _shared_prefix(a: Iterable[str], b: Iterable[str]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def _display(known: tuple[str, ...], parent: DocPath) -> str:
    """Show a known key path, with the real list indices where it runs through the user's parent."""
    generic_parent = tuple("[]" if isinstance(p, int) else str(p) for p in parent)
    if not parent or known[: len(parent)] != generic_parent:
        return show_key_path(known)
    rest = show_key_path(known[len(parent) :])
    return format_path(parent) + ("" if rest.startswith("[]") else ".") + rest
