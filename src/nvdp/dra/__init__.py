"""DRA driver mode: the node's GPUs and MIG devices published as ResourceSlices (resource.k8s.io/v1) and
prepared for claims through the kubelet's DRA plugin API, as NVIDIA's DRA driver for GPUs does."""
