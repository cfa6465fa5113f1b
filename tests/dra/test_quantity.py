"""Kubernetes quantities (nvdp.dra.claims.sharing.quantity): apimachinery's grammar, exact values, Value()'s
rounding."""

from __future__ import annotations

from fractions import Fraction

import pytest

from nvdp.dra.claims.sharing.quantity import QuantityError, parse_quantity, quantity_value


@pytest.mark.parametrize(("text", "value"), [
    ("4Gi", 4 * 2**30),
    ("512Mi", 512 * 2**20),
    ("1Ki", 1024),
    ("2Ti", 2 * 2**40),
    ("1Ei", 2**60),
    ("1G", 10**9),
    ("1500M", 1_500_000_000),
    ("3k", 3000),
    ("1E", 10**18),  # exa, not an exponent
    ("0.5Gi", 2**29),
    (".5Gi", 2**29),
    ("1.", 1),
    ("1073741824", 2**30),
    ("1e9", 10**9),
    ("1E3", 1000),
    ("15e-1", Fraction(3, 2)),
    ("1500m", Fraction(3, 2)),
    ("+2Mi", 2 * 2**20),
    ("-1Mi", -(2**20)),
    (" 4Gi ", 4 * 2**30),
])
def test_quantities_parse_exactly(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "4GB", "4gi", "4 Gi", "1e", "0x10", "1.2.3", "--1", "4Mi5",
                                  "1e999999999", "1" * 101])
def test_non_quantities_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_value_rounds_a_fraction_away_from_zero_as_apimachinery_does() -> None:
    assert quantity_value("1500m") == 2
    assert quantity_value("1001m") == 2
    assert quantity_value("1000m") == 1
    assert quantity_value("-1500m") == -2
    assert quantity_value("0.5Gi") == 2**29


def test_value_takes_json_integers_as_bytes_and_refuses_other_types() -> None:
    assert quantity_value(1073741824) == 2**30
    for bad in (True, 1.5, None, ["4Gi"]):
        with pytest.raises(QuantityError, match="not a quantity"):
            quantity_value(bad)  # type: ignore[arg-type]
