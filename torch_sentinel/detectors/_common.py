"""Small host-side helpers shared by several detectors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from .._collect.records import StepRecord

__all__ = ["common_module", "threshold", "trained_rows"]


def trained_rows(records: Iterable[StepRecord]) -> list[StepRecord]:
    """Rows of real optimizer steps: a backward ran and the AMP scaler did not skip the step."""
    return [r for r in records if r.meta.backward_calls > 0 and not r.meta.amp_skipped]


def common_module(owners: Iterable[Optional[str]]) -> str:
    """The deepest module containing all ``owners`` ("" is the root)."""
    parts: Optional[list[str]] = None
    for owner in owners:
        p = (owner or "").split(".") if owner else []
        if parts is None:
            parts = p
        else:
            n = 0
            while n < min(len(parts), len(p)) and parts[n] == p[n]:
                n += 1
            parts = parts[:n]
    return ".".join(parts or [])


def threshold(detector: Any, name: str) -> float:
    """``<kind>.<name>`` for ``detector``: the value given to ``attach(thresholds=...)``, else the
    default the detector declares in its ``thresholds`` class attribute. Declaring every key
    there is what lets ``attach()`` reject a misspelt one."""
    return float(detector.ctx.threshold(f"{detector.kind}.{name}", type(detector).thresholds[name]))
