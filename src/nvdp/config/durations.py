"""Go-style durations in config values: GFD's sleepInterval and the plugin's healthRecoveryAfter.

config-schema.json decides which texts a setting accepts; these functions turn accepted text into
seconds. `recovery_after_seconds` refuses exactly what the schema refuses for healthRecoveryAfter, so a
caller that did not go through the loader still cannot end up with a zero or negative delay.
"""

from __future__ import annotations

import math
import re

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

# flags.plugin.healthRecoveryAfter: `never`, or a duration whose every number carries a unit.
NEVER = "never"
RECOVERY_AFTER_FORMS = (
    "never, or a duration greater than zero such as 30s, 5m, 1h30m or 500ms; "
    "every number needs its unit (ns, us, µs, ms, s, m or h): 5m, not 5"
)
_RECOVERY_AFTER = re.compile(r"(never|([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+)")
_ALL_ZERO = re.compile(r"(0+(\.0*)?(ns|us|µs|ms|s|m|h))+")


def parse_duration(text: str) -> float:
    """A Go duration ("60s", "1m30s", "500ms", "0"), a number of nanoseconds ("5000ns" as the
    loader stores bare numbers), or "infinite" (math.inf), in seconds. The schema checked the form."""
    text = text.strip()
    if text == "infinite":
        return math.inf
    if text == "0":
        return 0.0
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 60s, 1m30s or infinite)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def recovery_after_seconds(text: str) -> float | None:
    """healthRecoveryAfter in seconds; None for `never` (a GPU stays Unhealthy until the plugin restarts).

    Raises ValueError naming the accepted forms for text the schema refuses: no unit ("5", "0"), zero
    ("0s", "0m0s"), a sign ("-1s"), "infinite", or anything else that is not a duration.
    """
    if _RECOVERY_AFTER.fullmatch(text) is None or _ALL_ZERO.fullmatch(text) is not None:
        raise ValueError(f"healthRecoveryAfter {text!r} is not valid: use {RECOVERY_AFTER_FORMS}")
    if text == NEVER:
        return None
    return parse_duration(text)
