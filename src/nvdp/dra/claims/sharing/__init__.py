"""What a claim's sharing does on the node: GpuConfig, time slices, MPS daemons and limits."""
