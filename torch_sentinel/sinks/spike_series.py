"""The figures around a loss spike, as TensorBoard scalars: one chart per series.

A ``loss_spike`` finding carries, in ``evidence["series"]``, the steps of its look-back window
and, for its top movers, their gradient, update and weight norms and the series that moved
first. They are written at their own steps under ``spike/<step>/``:
``spike/<step>/loss`` and ``spike/<step>/<module>/<series>`` (``grad_norm``, ``update_norm``,
``weight_norm``, ``exp_avg_sq_sum``, ``attention_logit``, ``output_lse``), so
TensorBoard draws the first mover leaving its baseline before the loss jumps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from .._findings import Finding

__all__ = ["SERIES_TAGS", "spike_scalars"]

#: Evidence series name -> tag suffix.
SERIES_TAGS = {
    "grad": "grad_norm",
    "update": "update_norm",
    "weight": "weight_norm",
    "exp_avg_sq": "exp_avg_sq_sum",
    "attention_logit": "attention_logit",
    "output_lse": "output_lse",
}


def spike_scalars(finding: Finding) -> Iterator[tuple[int, str, float]]:
    """``(step, tag, value)`` for every finite figure of a ``loss_spike`` finding's series."""
    series: Any = finding.evidence.get("series") if finding.kind == "loss_spike" else None
    if (
        not isinstance(series, dict)
        or not isinstance(series.get("steps"), list)
        or finding.step is None
    ):
        return
    steps = series["steps"]
    prefix = f"spike/{finding.step}"
    for name, values in series.items():
        if name == "steps":
            continue
        if name == "loss" and isinstance(values, list):
            yield from _points(steps, f"{prefix}/loss", values)
        elif isinstance(values, dict):
            module = name or "<model>"
            for stat, points in values.items():
                if isinstance(points, list):
                    yield from _points(
                        steps, f"{prefix}/{module}/{SERIES_TAGS.get(stat, stat)}", points
                    )


def _points(steps: list[Any], tag: str, values: list[Any]) -> Iterator[tuple[int, str, float]]:
    for step, value in zip(steps, values):
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield int(step), tag, float(value)
