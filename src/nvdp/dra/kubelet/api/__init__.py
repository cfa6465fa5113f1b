"""The kubelet's DRA plugin API (v1 and v1beta1) and plugin-registration API (v1): the .protos and
the Python modules generated from them.

Everything here but the .protos is generated; regenerate with `python scripts/generate_api.py`.
The generated service modules import grpc, so the package imports it first the plugin's way.
"""

from nvdp.daemon import grpc_import as _grpc_import  # noqa: F401  # keeps asyncio out; see there
