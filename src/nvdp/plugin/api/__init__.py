"""Kubernetes device-plugin API v1beta1: the .proto and the Python modules generated from it.

Everything here except `generate.py` is generated; regenerate with `python -m nvdp.plugin.api.generate`.
"""
