"""grpc, imported without Python's TLS stack, which the plugin process never uses.

    from nvdp.plugin.grpc_import import grpc

grpcio's core imports asyncio, and asyncio imports ssl where it can: that loads _ssl with the
system's libssl and libcrypto, about 4 MiB resident and 10 ms of start-up, into a process that speaks
gRPC over unix sockets only. gRPC's own TLS is built into its core and does not use the ssl module,
so it is unaffected, and a later `import ssl` anywhere else (an HTTPS client such as the Kubernetes
one) loads the real module as usual. What stays without TLS is asyncio's own: its module-level `ssl`
is None, so an asyncio TLS connection in this process would fail with "stdlib ssl module not
available"; the plugin makes none (import ssl before grpc if that ever changes). The plugin's modules
import grpc from here, so whichever of them comes first gets this.
"""

from __future__ import annotations

import sys

_hold_back = "grpc" not in sys.modules and "ssl" not in sys.modules
if _hold_back:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # makes `import ssl` raise ImportError
try:
    import grpc as grpc
finally:
    if _hold_back and "ssl" in sys.modules and sys.modules["ssl"] is None:
        del sys.modules["ssl"]

__all__ = ["grpc"]
