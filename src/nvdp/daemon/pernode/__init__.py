"""Which config and mode a node runs: the one per-node rule every daemon follows."""
