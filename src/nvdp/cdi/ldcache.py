"""glibc's `ld.so.cache`, parsed: which libraries the host's loader knows, and where they are.

Pure (bytes in, entries out). The fallback of the driver-library search when globbing the standard
library folders finds nothing, as in NVIDIA's toolkit (internal/ldcache). Format, little-endian:

- optional old part (glibc < 2.32 writes both): magic `ld.so-1.7.0\\0`, u32 count, that many 12-byte
  entries, zero-padding to 8 bytes;
- new part: magic `glibc-ld.so.cache` + `1.1`, u32 count, u32 string-table size, 3x u32 and u64 unused
  (48 bytes), then that many 24-byte entries: i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap.
  Key and value are offsets of NUL-terminated strings, counted from the start of the new part.
"""

from __future__ import annotations

import platform
import struct

from msgspec import Struct

from nvdp.cdi.errors import CdiError

OLD_MAGIC = b"ld.so-1.7.0\0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER = struct.Struct("<12sI")
_OLD_ENTRY_SIZE = 12
_NEW_HEADER = struct.Struct("<20sII12x8x")
_NEW_ENTRY = struct.Struct("<iIIIQ")
FLAG_ELF = 0x0001
FLAG_TYPE_MASK = 0x00FF
FLAG_ARCH_MASK = 0xFF00
# The 64-bit library flags glibc writes, by machine (sysdeps/generic/ldconfig.h).
ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00, "arm64": 0x0A00, "ppc64le": 0x0500}
FIX = "run `ldconfig` on the host to rebuild the cache, or install the driver in a standard library folder"


class LdCacheEntry(Struct, frozen=True):
    name: str  # the library's name, e.g. "libcuda.so.1"
    path: str  # where it is, as the host's loader sees it: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"


def native_arch_flags(machine: str | None = None) -> frozenset[int]:
    """The entries to keep on this machine: its own 64-bit flag; all three where the machine is unknown."""
    flag = ARCH_FLAGS.get(machine if machine is not None else platform.machine())
    return frozenset({flag}) if flag is not None else frozenset(set(ARCH_FLAGS.values()))


def _string(table: bytes, offset: int) -> str | None:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        return None
    return table[offset:end].decode("utf-8", "surrogateescape")


def parse(data: bytes, source: str, arch_flags: frozenset[int] | None = None) -> tuple[LdCacheEntry, ...]:
    """The entries of this machine's architecture (or of `arch_flags`), in the cache's order.

    A file that is not an ld.so.cache, or is cut short, raises CdiError naming `source`; an entry
    whose strings lie outside the file is skipped, as glibc's and NVIDIA's readers skip it.
    """
    flags_wanted = arch_flags if arch_flags is not None else native_arch_flags()
    start = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < _OLD_HEADER.size:
            raise _corrupt(source, "the old-format header is cut short")
        _, count = _OLD_HEADER.unpack_from(data)
        start = _OLD_HEADER.size + count * _OLD_ENTRY_SIZE
        start += -start % 8  # the new part starts 8-byte aligned
    if len(data) < start + _NEW_HEADER.size:
        raise _corrupt(source, f"{len(data)} bytes, too short for the {_NEW_HEADER.size}-byte header")
    magic, count, _table_size = _NEW_HEADER.unpack_from(data, start)
    if magic != NEW_MAGIC:
        raise _corrupt(source, f"no '{NEW_MAGIC.decode()}' header at byte {start}")
    entries_end = start + _NEW_HEADER.size + count * _NEW_ENTRY.size
    if entries_end > len(data):
        raise _corrupt(source, f"it announces {count} entries but ends at byte {len(data)}")
    table = data[start:]
    found: list[LdCacheEntry] = []
    for flags, key, value, _osversion, _hwcap in _NEW_ENTRY.iter_unpack(
        data[start + _NEW_HEADER.size:entries_end]
    ):
        if not flags & FLAG_TYPE_MASK & FLAG_ELF or flags & FLAG_ARCH_MASK not in flags_wanted:
            continue
        name, path = _string(table, key), _string(table, value)
        if name and path:
            found.append(LdCacheEntry(name, path))
    return tuple(found)


def _corrupt(source: str, why: str) -> CdiError:
    return CdiError(f"{source} is not a readable ld.so.cache ({why}); {FIX}")
