"""Why a loss spiked: the cause the first mover's figures support (pure host functions).

The first mover comes from ``_spike_movers.py``; then the first rule that holds, in this order:

- ``corrupted_weight``: a weight's norm changed by more than its update norm allows (the
  triangle inequality bounds ``| ||W_t|| - ||W_t-1|| |`` by ``||W_t - W_t-1||``, the update),
  by at least ``CORRUPT_JUMP`` of itself: something other than the optimizer wrote it.
- ``bad_batch``: nothing moved before the spike step, and at that step the gradients of at
  least ``BATCH_SHARE`` of the units left their baselines together (whether the inputs left
  the range of the steps before is reported beside it). Logits that left their baseline only at
  the spike step, with fewer gradients moving, name their own cause below: a climb that builds
  fast crosses the bar with the loss.
- by what the first mover moved first: its largest attention logit, or a part of an attention
  module whose largest logit left its baseline by the spike (``attention_logits``: the
  projections' gradients answer to the logits, and can cross their bar first); the output
  logits' log-sum-exp (``output_logits``); its update, with its param group's learning rate
  changed by ``LR_JUMP`` or more (``learning_rate``: the group's module is named); its
  gradient coming back from near zero (``RETURN_JUMP`` times its baseline or more) into a
  second moment that had decayed: the squared gradient norm ``DECAYED_V`` or more times the
  sum of ``exp_avg_sq``, which it matches in a steady state without clipping (with clipping the
  steady ratio is the clip factor squared, 4.6 on the benchmark, so the return from near zero
  is what decides) (``adam_second_moment``); its
  update jumping while its gradient stayed within ``RISING`` deviations (``learning_rate``).
- otherwise ``unknown``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from ._common import common_module
from ._spike_movers import (
    DEPART,
    LOGITS,
    RISING,
    Mover,
    SpikeWindow,
    baseline,
    deviation_at,
    movers,
    per_unit,
)

__all__ = ["CAUSES", "Mover", "SpikeVerdict", "SpikeWindow", "attribute", "per_unit"]

CAUSES = ("learning_rate", "bad_batch", "adam_second_moment", "attention_logits", "output_logits", "corrupted_weight")
CORRUPT_JUMP = 0.01
BATCH_SHARE = 0.5
LR_JUMP = 1.5
RETURN_JUMP = 10.0
DECAYED_V = 4.0


@dataclasses.dataclass(frozen=True)
class SpikeVerdict:
    first_mover: Optional[str]
    lead_steps: Optional[int]
    cause: str
    ranked: list[Mover]
    #: The figures behind the cause, in plain numbers (for the finding's evidence).
    figures: dict[str, object]
    #: One line: what the first mover did.
    why: str
    #: The window judged.
    window: Optional[SpikeWindow] = None


def _corrupted(window: SpikeWindow) -> Optional[tuple[Mover, dict[str, object]]]:
    """The earliest weight that changed by more than its update explains."""
    w, upd = window.stats.get("weight"), window.stats.get("update")
    if w is None:
        return None
    spike = window.spike_index
    found: Optional[tuple[int, float, int, float, float]] = None
    for t in range(1, spike + 1):
        with np.errstate(invalid="ignore", divide="ignore"):
            jump = np.abs(w[t] - w[t - 1])
            relative = jump / w[t - 1]
            explained = upd[t] if upd is not None else np.full_like(jump, np.nan)
            # Without an update norm, only a jump far beyond a healthy step's counts.
            limit = np.where(np.isfinite(explained), 1.5 * explained + 1e-6 * w[t], 0.1 * w[t - 1])
            bad = np.isfinite(relative) & (relative >= CORRUPT_JUMP) & (jump > limit)
        if bad.any():
            u = int(np.argmax(np.where(bad, relative, -np.inf)))
            found = (t, float(relative[u]), u, float(jump[u]), float(explained[u]))
            break
    if found is None:
        return None
    t, relative, u, jump, explained = found
    lead = window.spike_step - int(window.steps[t])
    mover = Mover(window.units[u], u, "weight", t, lead, relative)
    return mover, {"weight_change": jump, "update_norm": explained, "relative_change": relative,
                   "at_step": int(window.steps[t])}


def _lr_change(window: SpikeWindow, unit: int, lo: int, hi: int) -> Optional[tuple[int, float]]:
    """``(step index, ratio)`` of the first learning-rate change of ``unit``'s group in
    ``[lo, hi]`` by a factor of ``LR_JUMP`` or more."""
    key = window.unit_lr[unit] if unit < len(window.unit_lr) else None
    lr = window.lrs.get(key) if key is not None else None
    if lr is None:
        return None
    for t in range(max(lo, 1), hi + 1):
        a, b = lr[t - 1], lr[t]
        if np.isfinite(a) and np.isfinite(b) and a > 0 and b > 0 and max(b / a, a / b) >= LR_JUMP:
            return t, float(b / a)
    return None


def _inputs_outside(window: SpikeWindow) -> Optional[bool]:
    """Whether the spike step's inputs (smallest and largest value, or largest token id) left
    the range the window's earlier steps spanned; None when not recorded."""
    x = window.inputs
    spike = window.spike_index
    if x is None or spike == 0:
        return None
    before, now = x[:spike], x[spike]
    known = []
    for column, beyond in ((0, np.less), (1, np.greater)):
        past = before[:, column][np.isfinite(before[:, column])]
        if len(past) and np.isfinite(now[column]):
            edge = past.min() if column == 0 else past.max()
            known.append(bool(beyond(now[column], edge)))
    return any(known) if known else None


def _logit_cause(window: SpikeWindow, first: Mover) -> tuple[str, dict[str, object], str]:
    y = window.series(first.stat, first.index)
    before, at = _measured_before(y, first.onset), _measured_before(y, window.spike_index + 1)
    when = f"from {first.lead_steps} step(s) before the spike" if first.lead_steps else "up to the spike step"
    if first.stat == "attention_logit":
        return "attention_logits", {"logit_before": before, "logit_at_spike": at}, (
            f"its largest attention logit grew from {before:.3g} to {at:.3g} {when}")
    return "output_logits", {"lse_before": before, "lse_at_spike": at}, (
        f"the log-sum-exp of the output logits drifted from {before:.3g} to {at:.3g} {when}")


def _measured_before(y: np.ndarray, t: int) -> float:
    """The last measured (finite) value of ``y`` before index ``t`` (a step may have measured
    nothing: see ``_spike_movers.departure``), else the value at ``t``."""
    known = np.flatnonzero(np.isfinite(y[:t]))
    return float(y[known[-1]]) if len(known) else float(y[min(t, len(y) - 1)])


def _cause_of(window: SpikeWindow, first: Mover, ranked: list[Mover]) -> tuple[str, dict[str, object], str]:
    """The cause behind ``first`` (not a corrupted weight), with its figures and one line."""
    spike = window.spike_index
    u = first.index
    if first.lead_steps == 0 and first.stat in LOGITS:
        grads = window.stats.get("grad")
        n_units = int(np.isfinite(grads[spike]).sum()) if grads is not None else 0
        jumped = sum(1 for m in ranked if m.stat == "grad" and m.lead_steps == 0)
        if not n_units or jumped / n_units < BATCH_SHARE:
            return _logit_cause(window, first)
    if first.lead_steps == 0:
        grads = window.stats.get("grad")
        n_units = int(np.isfinite(grads[spike]).sum()) if grads is not None else 0
        jumped = sum(1 for m in ranked if m.stat == "grad" and m.lead_steps == 0)
        share = jumped / n_units if n_units else 0.0
        if share >= BATCH_SHARE:
            outside = _inputs_outside(window)
            seen = "; its inputs left the range of the steps before" if outside else ""
            return "bad_batch", {"units_jumped": jumped, "units": n_units, "share": share,
                                 "inputs_out_of_range": outside}, (
                f"the gradients of {jumped} of {n_units} units jumped together at the spike step, "
                f"and nothing moved before it{seen}")
        return "unknown", {"units_jumped": jumped, "units": n_units}, "nothing moved before the spike step"
    if first.stat in LOGITS:
        return _logit_cause(window, first)
    lr = _lr_change(window, u, max(first.onset - 1, 0), spike)
    if lr is not None:
        return "learning_rate", {"lr_ratio": lr[1], "lr_changed_at": int(window.steps[lr[0]])}, (
            f"the learning rate of its param group changed {lr[1]:.3g}x at step {int(window.steps[lr[0]])}")
    grad_dev = deviation_at(window, "grad", u, first.onset)
    g = window.series("grad", u)
    v = window.series("exp_avg_sq", u)
    base = g[baseline(window)]
    g0 = float(np.nanmedian(base)) if np.isfinite(base).any() else math.nan
    ratio = float(g[first.onset] ** 2 / v[first.onset]) if v[first.onset] > 0 else math.nan
    returned = g[first.onset] / g0 if g0 > 0 else math.inf
    if first.stat == "grad" or grad_dev >= DEPART:
        if np.isfinite(ratio) and ratio >= DECAYED_V and returned >= RETURN_JUMP:
            return "adam_second_moment", {"grad_return_ratio": returned, "grad_sq_over_exp_avg_sq": ratio}, (
                f"its gradient came back {returned:.3g}x its baseline into a decayed second moment "
                f"(squared gradient norm {ratio:.3g}x the sum of exp_avg_sq)")
        return "unknown", {"grad_deviation": grad_dev, "grad_sq_over_exp_avg_sq": ratio}, (
            "its gradient moved first, with no learning-rate change or decayed second moment behind it")
    upd = window.series("update", u)
    jump = float(upd[first.onset] / np.nanmedian(upd[baseline(window)]))
    if not np.isfinite(grad_dev) or grad_dev < RISING:
        return "learning_rate", {"update_jump": jump, "grad_deviation": grad_dev}, (
            f"its update grew {jump:.3g}x while its gradient stayed flat")
    return "unknown", {"update_jump": jump, "grad_deviation": grad_dev}, "its update grew with its gradient"


def attribute(window: SpikeWindow) -> SpikeVerdict:
    """The first mover before ``window``'s spike and the cause its figures support."""
    ranked = movers(window)
    corrupt = _corrupted(window)
    if corrupt is not None:
        mover, figures = corrupt
        ranked = [mover] + [m for m in ranked if m.unit != mover.unit]
        why = (f"its weight norm changed by {figures['relative_change']:.3g} of itself at step "
               f"{figures['at_step']}, more than its update ({figures['update_norm']:.3g}) explains")
        return SpikeVerdict(mover.unit, mover.lead_steps, "corrupted_weight", ranked, figures, why, window)
    if not ranked:
        return SpikeVerdict(None, None, "unknown", [], {}, "no unit left its baseline before the spike", window)
    first = ranked[0]
    inside = _enclosing_attention(first, ranked)
    if inside is not None:
        # A part of an attention module (its q/k/v projection) moved first, and the module's
        # largest logit left its baseline too: the logits, which the gradients answer to.
        cause, figures, why = _logit_cause(window, inside)
        figures["first_part"] = first.unit
        lead = max(first.lead_steps, inside.lead_steps)
        return SpikeVerdict(inside.unit, lead, cause, ranked, figures, why, window)
    cause, figures, why = _cause_of(window, first, ranked)
    name = first.unit
    if cause == "learning_rate" and "lr_ratio" in figures:
        name = _group_module(window, first, ranked)
    return SpikeVerdict(name, first.lead_steps, cause, ranked, figures, why, window)


def _enclosing_attention(first: Mover, ranked: list[Mover]) -> Optional[Mover]:
    """The attention module holding ``first``'s unit whose largest logit also left its baseline."""
    if first.stat in LOGITS:
        return None
    unit = first.unit.split("[")[0]
    for m in ranked:
        if m.stat == "attention_logit" and m.unit and unit.startswith(m.unit + "."):
            return m
    return None


def _group_module(window: SpikeWindow, first: Mover, ranked: list[Mover]) -> str:
    """The module holding every unit of ``first``'s param group that moved with it: a group's
    learning rate moves all of its units at once, so the group, not one of them, moved first."""
    key = window.unit_lr[first.index] if first.index < len(window.unit_lr) else None
    together = [m.unit.split("[")[0] for m in ranked
                if m.lead_steps == first.lead_steps and m.index < len(window.unit_lr) and window.unit_lr[m.index] == key]
    return common_module(together) if len(together) > 1 else first.unit
