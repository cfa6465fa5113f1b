"""What every nvdp daemon does, whichever GPUs' API it serves: the parts the device plugin, the DRA
plugin, the MPS control daemon and GPU feature discovery share (see docs/architecture.md)."""
