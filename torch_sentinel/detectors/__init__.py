"""Detectors: host code that turns flushed statistics into findings. One detector per file."""

from __future__ import annotations

from .base import Detector, RunContext

__all__ = ["Detector", "RunContext", "default_detectors"]


def default_detectors(ctx: RunContext, disable: frozenset[str] = frozenset()) -> list[Detector]:
    """Every detector that ships, minus the kinds switched off by ``attach(disable=...)``."""
    from . import registry

    return [cls(ctx) for cls in registry.DETECTORS if cls.kind not in disable]
