"""What a daemon reports: metrics, Node Events, logs, and its HTTP probe endpoints."""
