"""The kubelet's pod-resources API (v1): the .proto and the Python modules generated from it.

Everything here but the .proto is generated; regenerate with `python scripts/generate_api.py`.
The generated service module imports grpc, so the package imports it first the plugin's way.
"""

from nvdp.daemon import grpc_import as _grpc_import  # noqa: F401  # keeps asyncio out; see there
