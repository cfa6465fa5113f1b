"""NVIDIA GPU device plugin for Kubernetes."""

__version__ = "0.1.0"
