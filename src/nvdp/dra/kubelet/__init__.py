"""The DRA plugin's kubelet edge: the gRPC services, registration, the health stream, and the
pod-resources client (which containers on this node hold which claims)."""
