"""The DRA plugin's kubelet edge: the gRPC services, registration, the health stream."""
