"""Finding files in the host's driver tree as the plugin sees it (under a root such as /driver-root).

The edge of CDI discovery that globs and follows links. Paths come in and go out "inside" the tree
(`/usr/lib/x86_64-linux-gnu/libcuda.so.1`, what the host calls the file when the tree is its `/`);
`Tree.full` adds the root where the plugin must look. Search orders are NVIDIA's toolkit's
(pkg/lookup): the folders in the order given, each folder's matches sorted, symlinks resolved.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase

from nvdp.cdi import ldcache
from nvdp.cdi.errors import CdiError

# Where driver libraries are globbed first, in order (pkg/lookup/library.go); then the ld.so.cache.
LIBRARY_DIRS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
LDCACHE = "/etc/ld.so.cache"
DEFAULT_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
MAX_LINKS = 40


def is_file(path: str) -> bool:
    """Anything but a folder, links followed (NVIDIA's file filter: a socket counts)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def is_executable(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return not stat.S_ISDIR(st.st_mode) and bool(st.st_mode & 0o111)


class Tree:
    """A folder tree that is the host's driver root, seen from the plugin at `root`."""

    def __init__(self, root: str) -> None:
        self.root = posixpath.normpath(root) if root else "/"
        self._ldcache: tuple[ldcache.LdCacheEntry, ...] | None = None
        self._listings: dict[str, list[str]] = {}
        self.searched: list[str] = []  # where libraries were looked for, for a "not found" message

    def full(self, inside: str) -> str:
        """Where the plugin finds `inside`."""
        if self.root == "/":
            return posixpath.normpath(inside)
        return posixpath.join(self.root, inside.lstrip("/"))

    def resolve(self, inside: str) -> str | None:
        """`inside` with every symlink followed the way it resolves on the host (an absolute target is
        taken inside the tree, not in the plugin's own /); None when it does not exist."""
        parts = [p for p in inside.split("/") if p]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            if part == ".":
                continue
            candidate = "/" + "/".join([*done, part])
            full = self.full(candidate)
            if os.path.islink(full):
                hops += 1
                if hops > MAX_LINKS:
                    return None
                target = os.readlink(full)
                if target.startswith("/"):
                    done = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            done.append(part)
        result = "/" + "/".join(done)
        return result if os.path.lexists(self.full(result)) else None

    def matches(self, dirs: Iterable[str], pattern: str, keep: Callable[[str], bool] = is_file,
                count: int = 0) -> list[str]:
        """Inside paths matching `pattern` in each of `dirs` in turn, each folder's sorted; only those
        `keep(full path)` accepts, at most `count` (0: all). Links are not followed."""
        found: list[str] = []
        for folder in dirs:
            search = posixpath.join(self.full(folder), pattern.lstrip("/"))
            self.searched.append(search)
            for full in self._glob(search):
                if not keep(full):
                    continue
                found.append(self._inside(full))
                if count and len(found) == count:
                    return found
        return found

    def _glob(self, search: str) -> list[str]:
        """Sorted matches of `search`, a path whose last part only may hold wildcards. Each folder is read
        once per Tree: a library folder holds thousands of files and is searched a dozen times."""
        folder, name = posixpath.split(search)
        if glob.has_magic(folder):
            return sorted(glob.glob(search))
        if not glob.has_magic(name):
            return [search] if os.path.lexists(search) else []
        names = self._listings.get(folder)
        if names is None:
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                names = []
            self._listings[folder] = names
        hidden = name.startswith(".")  # as glob: a wildcard does not match a leading dot
        matched = fnmatch.filter(names, name)
        return [posixpath.join(folder, n) for n in matched if hidden or not n.startswith(".")]

    def resolved(self, dirs: Iterable[str], pattern: str) -> list[str]:
        """The files matching `pattern` in `dirs`, links resolved, each once (NVIDIA's symlink locator)."""
        out: list[str] = []
        # Any match, links judged after resolving them in the tree: an absolute link's target is the
        # host's path, which the plugin's own stat would look for outside the tree.
        for inside in self.matches(dirs, pattern, keep=os.path.lexists):
            target = self.resolve(inside)
            if target is not None and target not in out and is_file(self.full(target)):
                out.append(target)
        return out

    def libraries(self, pattern: str) -> list[str]:
        """Libraries by file-name pattern: globbed in LIBRARY_DIRS, else looked up in the tree's
        ld.so.cache (a corrupt cache raises CdiError then, naming it)."""
        found = self.resolved(LIBRARY_DIRS, pattern)
        if found:
            return found
        self.searched.append(self.full(LDCACHE))
        out: list[str] = []
        for entry in self._cache_entries():
            target = self.resolve(entry.path)
            names = {posixpath.basename(entry.path), posixpath.basename(target or "")}
            if target is not None and any(fnmatchcase(n, pattern) for n in names) and target not in out:
                out.append(target)
        return out

    def executables(self, names: Sequence[str], search_path: str = "") -> list[str]:
        """The first executable of each name in `search_path` ($PATH's form) then the default path, inside
        the tree."""
        dirs = list(dict.fromkeys([*(d for d in search_path.split(":") if d), *DEFAULT_PATH]))
        out: list[str] = []
        for name in names:
            out += self.matches(dirs, name, keep=is_executable, count=1)
        return out

    def _cache_entries(self) -> tuple[ldcache.LdCacheEntry, ...]:
        if self._ldcache is None:
            path = self.full(LDCACHE)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                data = b""
            except OSError as err:
                raise CdiError(f"{path} cannot be read ({err.strerror}); {ldcache.FIX}") from None
            self._ldcache = ldcache.parse(data, path) if data else ()
        return self._ldcache

    def _inside(self, full: str) -> str:
        if self.root == "/":
            return full
        return "/" + posixpath.relpath(full, self.root).lstrip("/")

