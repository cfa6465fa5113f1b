"""What the DRA plugin publishes: the node's devices, their slices, counters and health taints."""
