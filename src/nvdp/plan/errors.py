"""Errors raised while planning resources: a plan that cannot be built."""

from __future__ import annotations


class PlanError(ValueError):
    """The config cannot be applied to this node's GPUs; the message names the cause and the fix."""
