"""Kubernetes resource quantities ("4Gi", "1500M", "0.5Gi", "1e9", "100m"), parsed exactly.

The grammar is apimachinery's `resource.Quantity`: an optionally signed decimal number, then one
suffix: binary SI (Ki Mi Gi Ti Pi Ei), decimal SI (m k M G T P E) or a decimal exponent (e3, E-2).
Whole values come out as `Value()` gives them: a fraction is rounded away from zero.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[mkMGTPE]))?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Far beyond any memory size; keeps a hostile "1e999999999" from costing time and memory.
_MAX_EXPONENT = 64
_MAX_LENGTH = 100


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message says what is wrong."""


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string; QuantityError when it is not one."""
    stripped = text.strip()  # the API's JSON decoding trims spaces too
    if len(stripped) > _MAX_LENGTH:
        raise QuantityError(f"{text[:20]!r}... is not a quantity: longer than {_MAX_LENGTH} characters")
    m = _QUANTITY.fullmatch(stripped)
    if m is None:
        raise QuantityError(f"{text!r} is not a quantity: write a number with an optional suffix, such as "
                            "4Gi, 512Mi, 1G or 1500M")
    value = Fraction(m["number"])
    if m["binary"]:
        value *= _BINARY[m["binary"]]
    elif m["exponent"] is not None or m["decimal"]:
        exponent = int(m["exponent"]) if m["exponent"] is not None else _DECIMAL[m["decimal"]]
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r} is out of range: the exponent is more than {_MAX_EXPONENT}")
        value *= Fraction(10) ** exponent
    return -value if m["sign"] == "-" else value


def quantity_value(value: str | int) -> int:
    """A quantity (a string, or a JSON integer) as a whole number, a fraction rounded away from zero."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise QuantityError(f"{value!r} is not a quantity: write a string such as 4Gi or a whole number")
    if isinstance(value, int):
        return value
    exact = parse_quantity(value)
    return math.ceil(exact) if exact >= 0 else math.floor(exact)
