"""Replica divergence: prove, cheaply and often, that data-parallel replicas hold the same
weights and optimizer state.

``fingerprint.py`` (device work: integer bit sums and a float64 +-1 projection per tensor),
``plan.py`` (which tensors are replicas, across which group), ``exchange.py`` (collectives that
survive a failure on one rank), ``vote.py`` (the majority verdict, host code), ``bisect.py``
(narrowing to <= 128 elements), ``compare.py`` (one group's comparison) and ``check.py`` (the
probe: when it runs and what happens). The finding and the error are made by
``detectors/replica_divergence.py``.
"""

from __future__ import annotations

from .check import ReplicaCheck

__all__ = ["ReplicaCheck"]
