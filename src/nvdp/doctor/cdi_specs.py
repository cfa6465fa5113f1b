"""The CDI spec directories as a container runtime reads them: which qualified device names resolve.

Pure over the file contents it is given (the doctor's CDI check reads the directories), with the CDI
library's rules (cncf-tags/container-device-interface pkg/cdi/cache.go): only `.json` and `.yaml`
files count, a file that does not load or validate is skipped (its devices do not resolve), a later
directory has priority over an earlier one, and a name defined twice within one directory (in two
files) is a conflict that makes it unresolvable, even when a later directory defines it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from msgspec import Struct, field

SPEC_SUFFIXES = (".json", ".yaml")
# A spec file larger than this is not read (nvdp's own are a few hundred KiB at most).
MAX_SPEC_BYTES = 16 << 20


class Resolved(Struct, frozen=True):
    """What the directories resolve: qualified name -> the file defining it; the names in conflict
    (with their files); the files skipped and why; the directories that could not be listed."""

    names: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    unreadable_dirs: dict[str, str] = field(default_factory=dict)


def spec_names(path: str, data: bytes) -> list[str]:
    """The qualified device names of one spec file; ValueError (or CdiError) when a loader would skip it."""
    from nvdp.cdi.spec import decode, qualified, validate

    if path.endswith(".yaml"):
        import yaml

        try:
            doc = yaml.safe_load(data)
        except yaml.YAMLError as err:
            raise ValueError(f"not YAML: {' '.join(str(err).split())}") from None
        data = json.dumps(doc).encode()
    spec = decode(data, path)
    validate(spec)
    return [qualified(spec.kind, device.name) for device in spec.devices]


def resolve(files: Iterable[tuple[str, str, bytes | None, str]]) -> Resolved:
    """`files`: (directory, path, content or None, why unreadable), directories from lowest priority to
    highest, as CDI scans them."""
    names: dict[str, tuple[str, str]] = {}  # name -> (directory, file)
    conflicts: dict[str, set[str]] = {}
    skipped: dict[str, str] = {}
    for directory, path, data, why in files:
        if data is None:
            skipped[path] = why
            continue
        try:
            found = spec_names(path, data)
        except Exception as err:  # whatever makes a loader skip the file
            skipped[path] = " ".join(str(err).split())
            continue
        for name in found:
            old = names.get(name)
            if old is not None and old[0] == directory and old[1] != path:
                conflicts.setdefault(name, {old[1]}).add(path)
                continue
            names[name] = (directory, path)
    for name in conflicts:
        names.pop(name, None)
    return Resolved(
        names={name: where[1] for name, where in names.items()},
        conflicts={name: tuple(sorted(paths)) for name, paths in conflicts.items()},
        skipped=skipped,
    )


def read_dirs(dirs: Sequence[Path]) -> Resolved:
    """Read the spec files of `dirs` (lowest priority first) and resolve them."""
    files: list[tuple[str, str, bytes | None, str]] = []
    unreadable: dict[str, str] = {}
    for directory in dirs:
        try:
            entries = sorted(p for p in directory.iterdir() if p.suffix in SPEC_SUFFIXES)
        except FileNotFoundError:
            continue  # no directory, no specs: CDI does not mind
        except OSError as err:
            unreadable[str(directory)] = err.strerror or str(err)
            continue
        for entry in entries:
            files.append((str(directory), str(entry), *_read(entry)))
    resolved = resolve(files)
    return Resolved(resolved.names, resolved.conflicts, resolved.skipped, unreadable)


def _read(path: Path) -> tuple[bytes | None, str]:
    try:
        if not path.is_file():
            return None, "not a regular file"
        if path.stat().st_size > MAX_SPEC_BYTES:
            return None, f"larger than {MAX_SPEC_BYTES >> 20} MiB"
        return path.read_bytes(), ""
    except OSError as err:
        return None, f"unreadable: {err.strerror or err}"
