"""Who uses which GPU: what a prepared device is, in the claim's status and in its containers' files.

`device` computes it once per prepared device; the claim's status (KEP-4817, written by `status`) and
the device metadata files (KEP-5304, their format and paths in `metadata`) are two writings of it,
both made from a prepared claim's checkpoint entry by `claim`.
"""
