"""Whatever the input, the loader gives a Config or a ConfigError, never another exception."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdp.config.loader import ConfigError, load_config_text
from nvdp.config.model import Config
from nvdp.config.schema import key_paths

KEYS = sorted({part for path in key_paths() for part in path if part != "[]"})
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=70),
    st.sampled_from(
        ["", "all", "v1", "mixed", "envvar", "0", "0:1", "GPU-1", "gpu", "nvidia.com/gpu", "x" * 70]
    ),
    st.text(max_size=8),
    st.floats(allow_nan=True),
)


def documents() -> st.SearchStrategy[Any]:
    """Nested mappings built mostly from real config keys, so the checks past the top level run."""
    keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=6))
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)),
        max_leaves=25,
    )


def load(data: str | bytes, env: dict[str, str] | None = None) -> Config | ConfigError:
    try:
        return load_config_text(data, "fuzz.yaml", env=env or {})
    except ConfigError as exc:
        assert exc.issues
        assert all(str(issue) for issue in exc.issues)
        return exc


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_any_text(text: str) -> None:
    load(text)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_any_bytes(data: bytes) -> None:
    load(data)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), documents(), max_size=5))
def test_documents_from_schema_keys(doc: dict[str, Any]) -> None:
    load(yaml.safe_dump(doc))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "version": st.sampled_from(["v1", "", "v2"]),
            "flags": st.fixed_dictionaries(
                {},
                optional={
                    "migStrategy": st.sampled_from(["none", "single", "mixed", "x"]),
                    "mpsRoot": st.sampled_from(["", "/run/nvidia/mps"]),
                    "plugin": st.fixed_dictionaries(
                        {}, optional={"deviceListStrategy": st.one_of(SCALARS, st.lists(SCALARS))}
                    ),
                },
            ),
            "sharing": st.fixed_dictionaries(
                {},
                optional={
                    kind: st.fixed_dictionaries(
                        {},
                        optional={
                            "renameByDefault": SCALARS,
                            "resources": st.lists(
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "name": SCALARS,
                                        "rename": SCALARS,
                                        "replicas": SCALARS,
                                        "devices": st.one_of(SCALARS, st.lists(SCALARS, max_size=3)),
                                    },
                                ),
                                max_size=3,
                            ),
                        },
                    )
                    for kind in ("timeSlicing", "mps")
                },
            ),
            "imex": st.fixed_dictionaries({}, optional={"channelIDs": st.lists(SCALARS, max_size=2)}),
        },
    ),
    st.dictionaries(
        st.sampled_from(
            ["MIG_STRATEGY", "MPS_ROOT", "IMEX_CHANNEL_IDS", "PASS_DEVICE_SPECS", "DEVICE_LIST_STRATEGY"]
        ),
        st.text(max_size=10),
        max_size=3,
    ),
)
def test_shaped_documents_with_env(doc: dict[str, Any], env: dict[str, str]) -> None:
    result = load(yaml.safe_dump(doc), env)
    if isinstance(result, Config):
        # A loaded config is usable as-is: names qualified, shared resources present.
        for block in (result.sharing.time_slicing, result.sharing.mps):
            if block is not None:
                assert block.resources
                assert all(r.name.startswith("nvidia.com/") and r.replicas >= 1 for r in block.resources)
