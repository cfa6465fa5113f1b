"""grpc, imported without the asyncio half the plugin process never uses.

    from nvdp.daemon.grpc_import import grpc

grpcio's core (`cygrpc`) runs `import asyncio` when it loads, and `grpc/__init__.py` ends with
`from grpc import aio`. Both are for the asyncio server and channel; the plugin serves with the
thread-pool server and calls the kubelet with a blocking channel. Loading them costs a quarter of
grpc's import time (about 60 modules, 15-25 ms here) and about 2.6 MiB resident, and asyncio in turn
loads Python's ssl with the system's libssl and libcrypto (another 4 MiB).

So, when grpc is imported here first, `asyncio` and `grpc.aio` enter `sys.modules` as stand-ins
that load the real module on the first attribute anyone reads from them (cygrpc only keeps a
reference at import time; it reads from asyncio only on its aio code paths). Any later `import
asyncio` in the process, `from asyncio import X`, `import asyncio.events`, or `grpc.aio.server()`
loads the real module then, ssl included, and every holder of the stand-in sees the real namespace
from then on. Nothing is patched inside grpc or asyncio.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

_load_lock = threading.RLock()


class _LoadedOnFirstUse(types.ModuleType):
    """Sits in `sys.modules` for a module until the first attribute read, then becomes it."""

    def __getattr__(self, attr: str) -> Any:
        # Only called for attributes the stand-in lacks: once loaded it holds the real namespace.
        real = _load(self)
        return getattr(real, attr)


def _load(stand_in: _LoadedOnFirstUse) -> types.ModuleType:
    name = stand_in.__name__
    with _load_lock:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        real = importlib.import_module(name)  # also rebinds the parent package's attribute
        stand_in.__dict__.update(real.__dict__)
        return real


# Only when grpc is first imported here: a process that already has asyncio keeps it as it is.
_deferred = [] if "grpc" in sys.modules else [n for n in ("asyncio", "grpc.aio") if n not in sys.modules]
for _name in _deferred:
    sys.modules[_name] = _LoadedOnFirstUse(_name)
try:
    import grpc as grpc
except BaseException:
    for _name in _deferred:
        if isinstance(sys.modules.get(_name), _LoadedOnFirstUse):
            del sys.modules[_name]
    raise

__all__ = ["grpc"]
