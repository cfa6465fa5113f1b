"""A shared library's SONAME (`DT_SONAME`), read from its ELF file without a dependency.

The spec needs it for the `create-symlinks` hook (`<dir>/<SONAME>` -> the versioned file) and for the
hook-less mounts. As Go's debug/elf (which NVIDIA's toolkit uses): the `SHT_DYNAMIC` section, its
linked string table, the first `DT_SONAME` entry; a library without one is named by its file.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO, NamedTuple

ELF_MAGIC = b"\x7fELF"
SHT_DYNAMIC = 6
DT_NULL = 0
DT_SONAME = 14
MAX_SECTIONS = 4096
MAX_DYNAMIC_BYTES = 1 << 20


class _Layout(NamedTuple):
    """Where the fields nvdp reads lie, for one ELF class."""

    addr: str  # an address or offset
    shoff_at: int  # e_shoff; e_shentsize and e_shnum are the two u16 at shentsize_at
    shentsize_at: int
    section: str  # a section header up to sh_link: sh_type, sh_offset, sh_size, sh_link
    dynamic: str  # one dynamic entry: d_tag, d_val


_LAYOUTS = {
    1: _Layout("I", 0x20, 0x2E, "4xI4x4xIII", "iI"),  # ELFCLASS32
    2: _Layout("Q", 0x28, 0x3A, "4xI8x8xQQI", "qQ"),  # ELFCLASS64
}


def read_soname(path: str) -> str | None:
    """The SONAME of the ELF file at `path`: its DT_SONAME, or its file name when it has none.

    None when the file is not an ELF shared object nvdp can read (an empty placeholder, a script,
    a truncated file): the caller then makes no SONAME link for it, as NVIDIA's toolkit does.
    """
    try:
        with open(path, "rb") as f:
            soname = _soname(f)
    except (OSError, struct.error, ValueError):
        return None
    return soname if soname is not None else os.path.basename(path)


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("short read")
    return data


def _soname(f: BinaryIO) -> str | None:
    ident = _read(f, 0, 16)
    if ident[:4] != ELF_MAGIC or ident[4] not in _LAYOUTS:
        raise ValueError("not an ELF file")
    layout = _LAYOUTS[ident[4]]
    order = "<" if ident[5] == 1 else ">"
    (shoff,) = struct.unpack(order + layout.addr, _read(f, layout.shoff_at, struct.calcsize(layout.addr)))
    shentsize, shnum = struct.unpack(order + "HH", _read(f, layout.shentsize_at, 4))
    if shoff == 0 or not 0 < shnum <= MAX_SECTIONS:
        raise ValueError("no section headers")
    section = struct.Struct(order + layout.section)
    if shentsize < section.size:
        raise ValueError("section headers too small")
    headers = [section.unpack_from(_read(f, shoff + i * shentsize, section.size)) for i in range(shnum)]
    for sh_type, sh_offset, sh_size, sh_link in headers:
        if sh_type != SHT_DYNAMIC or sh_link >= shnum:
            continue
        _, str_offset, str_size, _ = headers[sh_link]
        entry = struct.Struct(order + layout.dynamic)
        size = min(sh_size, MAX_DYNAMIC_BYTES) // entry.size * entry.size
        for tag, value in entry.iter_unpack(_read(f, sh_offset, size)):
            if tag == DT_NULL:
                break
            if tag == DT_SONAME and value < str_size:
                strings = _read(f, str_offset + value, min(256, str_size - value))
                return strings.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        return None
    return None
