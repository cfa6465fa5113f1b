"""`nvdp doctor`: diagnose a GPU node and the plugin on it."""
