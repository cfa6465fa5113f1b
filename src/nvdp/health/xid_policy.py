"""Which XIDs mark a device unhealthy: the config's disable/enable lists (NVIDIA's DP_DISABLE_HEALTHCHECKS
and DP_ENABLE_HEALTHCHECKS) turned into a policy the health loop asks about each XID.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import Struct

from nvdp.config.model import DEFAULT_IGNORED_XIDS, Config

ALL_WORDS = ("all", "xids")


class XidPolicy(Struct, frozen=True):
    """Which XIDs mark a device unhealthy (NVIDIA's DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS)."""

    enabled: bool = True  # False: no health checks at all, NVML events are not even registered
    ignored: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    forced: frozenset[int] = frozenset()  # counted even when also ignored
    all_forced: bool = False  # every XID counts, the default-ignored ones too
    malformed: tuple[str, ...] = ()  # values that were neither a word nor a number, for the log

    def is_critical(self, xid: int) -> bool:
        if not self.enabled:
            return False
        if self.all_forced or xid in self.forced:
            return True
        return xid not in self.ignored

    def describe(self) -> str:
        if not self.enabled:
            return "health checks disabled"
        if self.all_forced:
            return "every XID marks a device unhealthy"
        ignored = sorted(self.ignored - self.forced)
        return f"ignoring XIDs {ignored}" if ignored else "no XIDs ignored"


def _split(values: Iterable[str]) -> list[str]:
    # Each value may itself be a comma list, as the environment variables are.
    return [part.strip().lower() for value in values for part in str(value).split(",") if part.strip()]


def _parse(values: Iterable[str], malformed: list[str]) -> tuple[bool, set[int]]:
    everything = False
    numbers: set[int] = set()
    for word in _split(values):
        if word in ALL_WORDS:
            everything = True
            continue
        try:
            number = int(word, 10)
        except ValueError:
            number = -1
        if number < 0:
            malformed.append(word)
        else:
            numbers.add(number)
    return everything, numbers


def xid_policy(disable: Sequence[str] = (), enable: Sequence[str] = ()) -> XidPolicy:
    """Build the policy from the disable/enable lists ("all", "xids" or XID numbers, comma lists allowed)."""
    malformed: list[str] = []
    disable_all, extra_ignored = _parse(disable, malformed)
    enable_all, forced = _parse(enable, malformed)
    return XidPolicy(
        enabled=not disable_all,
        ignored=frozenset(DEFAULT_IGNORED_XIDS) | frozenset(extra_ignored),
        forced=frozenset(forced),
        all_forced=enable_all,
        malformed=tuple(malformed),
    )


def policy_from_config(config: Config) -> XidPolicy:
    plugin = config.flags.plugin
    return xid_policy(plugin.disable_health_checks, plugin.enable_health_checks)
