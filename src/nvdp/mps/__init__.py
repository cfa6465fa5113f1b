"""MPS sharing: the control daemon that runs `nvidia-cuda-mps-control` per shared resource.

Layout of the MPS root shared by the daemon and the plugin: see `nvdp.mps.paths`.
"""
