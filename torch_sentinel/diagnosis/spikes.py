"""A short timeline of a ``loss_spike`` finding: who left its baseline when, then the spike."""

from __future__ import annotations

import math
from typing import Any, Optional

from .._findings import Finding

__all__ = ["LONG_EVIDENCE", "spike_timeline"]

#: Evidence keys too long for a one-line evidence summary (shown as a timeline instead).
LONG_EVIDENCE = frozenset({"series"})

_NAMES = {"grad": "gradient norm", "update": "update norm", "weight": "weight norm",
          "exp_avg": "exp_avg norm", "exp_avg_sq": "exp_avg_sq sum",
          "attention_logit": "largest attention logit", "output_lse": "output log-sum-exp"}


def _value_at(series: dict[str, Any], module: str, stat: str, step: int) -> Optional[float]:
    steps, rows = series.get("steps"), series.get(module)
    if not isinstance(steps, list) or not isinstance(rows, dict) or step not in steps:
        return None
    values = rows.get(stat)
    if not isinstance(values, list):
        return None
    value = values[steps.index(step)]
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _before(series: dict[str, Any], module: str, stat: str) -> Optional[float]:
    """The series' median over the window's first four steps (its baseline)."""
    rows = series.get(module)
    values = rows.get(stat) if isinstance(rows, dict) else None
    if not isinstance(values, list):
        return None
    head = sorted(v for v in values[:4] if isinstance(v, (int, float)) and math.isfinite(v))
    return head[len(head) // 2] if head else None


def spike_timeline(finding: Finding) -> list[str]:
    """A few lines: each top mover at the step it left its baseline, then the spike and its cause."""
    ev = finding.evidence
    if finding.kind != "loss_spike" or finding.step is None:
        return []
    found = ev.get("series")
    series: dict[str, Any] = found if isinstance(found, dict) else {}
    events: list[tuple[int, int, str]] = []
    for rank, mover in enumerate(ev.get("ranked") or []):
        if not isinstance(mover, dict) or not isinstance(mover.get("lead_steps"), int):
            continue
        module, stat, step = str(mover.get("module")), str(mover.get("stat")), finding.step - mover["lead_steps"]
        was, now = _before(series, module, stat), _value_at(series, module, stat, step)
        change = ""
        if was is not None and now is not None:
            ratio = f" ({now / was:.3g}x)" if was > 0 and stat not in ("attention_logit", "output_lse") else ""
            change = f" {was:.3g} -> {now:.3g}{ratio}"
        mark = ""
        if rank == 0:
            named = finding.module
            inside = f", in {named or '<model>'}" if named is not None and named != module else ""
            mark = f"   <- first mover{inside}"
        events.append((step, rank, f"{module}: {_NAMES.get(stat, stat)} left its baseline{change}{mark}"))
    events.sort()
    lines = [f"step {step:>7}  {text}" for step, _, text in events]
    loss, z, median = ev.get("loss"), ev.get("z"), ev.get("median")
    spike = f"step {finding.step:>7}  loss {loss:.4g}" if isinstance(loss, float) else f"step {finding.step:>7}  loss spike"
    if isinstance(z, float) and isinstance(median, float):
        spike += f" (robust z {z:.3g}, median {median:.4g})"
    lines.append(f"{spike}   <- spike; cause: {ev.get('cause', 'unknown')}")
    return lines
