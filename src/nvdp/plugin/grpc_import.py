"""Import grpc without Python's TLS stack, which the plugin process never uses.

grpcio's core imports asyncio, and asyncio imports ssl where it can: that loads _ssl with the
system's libssl and libcrypto, about 4 MiB resident and 10 ms of start-up, into a process that speaks
gRPC over unix sockets only. gRPC's own TLS is built into its core and does not use the ssl module,
so it is unaffected. Only asyncio's module-level `ssl` stays None; a later `import ssl` anywhere else
(a Kubernetes client, say) loads the real module as usual.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_grpc() -> ModuleType:
    """grpc, imported the first time with ssl held back; a no-op once grpc is loaded."""
    loaded = sys.modules.get("grpc")
    if loaded is not None:
        return loaded
    hold_back = "ssl" not in sys.modules
    if hold_back:
        sys.modules["ssl"] = None  # type: ignore[assignment]  # makes `import ssl` raise ImportError
    try:
        import grpc
    finally:
        if hold_back and "ssl" in sys.modules and sys.modules["ssl"] is None:
            del sys.modules["ssl"]
    module: ModuleType = grpc
    return module
