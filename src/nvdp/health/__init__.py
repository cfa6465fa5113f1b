"""GPU health as one record per node: which GPUs are down, why, and what brings each one back.

- `xids`: NVIDIA's XID catalogue reduced to what a fault needs to end (time, or a GPU reset);
- `ledger`: the rules, as plain functions of faults, NVML re-checks and the clock;
- `checks`: the NVML re-check of one GPU (the edge to the driver);
- `state`: the ledger on disk, so that a restart does not forget and GPU feature discovery can label.

The device plugin and the DRA plugin each run `nvdp.daemon.health.HealthMonitor` on this; whichever
serves the node's GPUs is the one authority for their health.
"""
