"""ld.so.cache parsing: the host's real cache against `ldconfig -p`, both file formats, and damage."""

from __future__ import annotations

import os
import platform
import random
import re
import shutil
import struct
import subprocess

import pytest

from nvdp.cdi import ldcache
from nvdp.cdi.errors import CdiError

X86_64 = 0x0303  # ELF libc6 x86-64, as glibc writes it
AARCH64 = 0x0A03
I386 = 0x0003
# ldconfig -p's architecture words for the 64-bit flags nvdp keeps on this machine.
ARCH_WORDS = {"x86_64": "x86-64", "aarch64": "AArch64", "ppc64le": "64bit"}


def new_format(entries: list[tuple[int, str, str]]) -> bytes:
    """A glibc 2.32+ cache: header, 24-byte entries, then the strings (offsets from the header)."""
    header_size, entry_size = 48, 24
    strings = b""
    offsets = []
    base = header_size + entry_size * len(entries)
    for _, key, value in entries:
        k = base + len(strings)
        strings += key.encode() + b"\0"
        v = base + len(strings)
        strings += value.encode() + b"\0"
        offsets.append((k, v))
    header = struct.pack("<20sII12x8x", ldcache.NEW_MAGIC, len(entries), len(strings))
    body = b"".join(struct.pack("<iIIIQ", flags, k, v, 0, 0)
                    for (flags, _, _), (k, v) in zip(entries, offsets, strict=True))
    return header + body + strings


def with_old_part(new: bytes, old_entries: int) -> bytes:
    """The same cache behind an old-format part (glibc < 2.32 wrote both), padded to 8 bytes."""
    old = struct.pack("<12sI", ldcache.OLD_MAGIC, old_entries) + b"\xee" * (12 * old_entries)
    return old + b"\0" * (-len(old) % 8) + new


ENTRIES = [
    (X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    (I386, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
    (AARCH64, "libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1"),
    (0x0300, "not-elf.so", "/x/not-elf.so"),  # type bits without the ELF flag
]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile("/etc/ld.so.cache") or shutil.which("ldconfig") is None,
                    reason="no /etc/ld.so.cache or ldconfig on this machine")
def test_the_hosts_cache_matches_ldconfig() -> None:
    word = ARCH_WORDS.get(platform.machine())
    if word is None:
        pytest.skip(f"no ldconfig architecture word for {platform.machine()}")
    with open("/etc/ld.so.cache", "rb") as f:
        parsed = ldcache.parse(f.read(), "/etc/ld.so.cache")
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    line = re.compile(r"^\s+(\S+) \(([^)]*)\) => (\S+)$")
    expected = [(m[1], m[3]) for m in map(line.match, listing.splitlines()) if m and word in m[2].split(",")]
    assert expected, "ldconfig -p listed no library of this machine's architecture"
    assert [(e.name, e.path) for e in parsed] == expected


def test_new_format_keeps_this_architectures_entries() -> None:
    data = new_format(ENTRIES)
    assert ldcache.parse(data, "c", frozenset({0x0300})) == (
        ldcache.LdCacheEntry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    )
    assert [e.path for e in ldcache.parse(data, "c", frozenset({0x0A00}))] == [
        "/usr/lib/aarch64-linux-gnu/libcuda.so.1"
    ]


def test_the_old_part_is_skipped() -> None:
    data = with_old_part(new_format(ENTRIES), old_entries=3)
    assert [e.name for e in ldcache.parse(data, "c", frozenset({0x0300}))] == ["libcuda.so.1"]


def test_native_flags() -> None:
    assert ldcache.native_arch_flags("x86_64") == {0x0300}
    assert ldcache.native_arch_flags("aarch64") == {0x0A00}
    assert ldcache.native_arch_flags("riscv64") == {0x0300, 0x0A00, 0x0500}


def test_an_entry_pointing_outside_the_file_is_skipped() -> None:
    data = bytearray(new_format(ENTRIES[:1]))
    struct.pack_into("<I", data, 48 + 8, 1 << 30)  # the value's offset
    assert ldcache.parse(bytes(data), "c", frozenset({0x0300})) == ()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "too short"),
        (b"glibc-ld.so.cache1.1", "too short"),
        (b"not a cache, but long enough to hold a header of forty-eight bytes", "no 'glibc-ld.so.cache1.1'"),
        (struct.pack("<12sI", ldcache.OLD_MAGIC, 1000), "too short"),
        (new_format(ENTRIES)[:60], "announces 4 entries"),
    ],
)
def test_damage_is_a_cdi_error_naming_the_file(data: bytes, why: str) -> None:
    with pytest.raises(CdiError, match=f"/driver-root/etc/ld.so.cache is not a readable ld.so.cache.*{why}"):
        ldcache.parse(data, "/driver-root/etc/ld.so.cache")


def test_any_truncation_or_flipped_byte_is_parsed_or_refused() -> None:
    """Never an IndexError, struct.error or UnicodeDecodeError: an entry list or a CdiError."""
    whole = with_old_part(new_format(ENTRIES), old_entries=2)
    rng = random.Random(7)
    damaged = [whole[:n] for n in range(len(whole))]
    for _ in range(500):
        flipped = bytearray(whole)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        damaged.append(bytes(flipped))
    outcomes = {"parsed": 0, "refused": 0}
    for data in damaged:
        try:
            ldcache.parse(data, "c")
        except CdiError:
            outcomes["refused"] += 1
        else:
            outcomes["parsed"] += 1
    assert outcomes["parsed"] and outcomes["refused"]  # both paths were taken
