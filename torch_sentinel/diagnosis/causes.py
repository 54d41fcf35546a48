"""Cause before symptom: rank the likely causes of a non-finite value from evidence already on
the host when it appeared.

A NaN is a symptom. The rows of the steps before it (plain numbers, already copied) usually say
what made it: a learning rate that grew or an update/weight ratio far above its band (weights,
activations and the loss climb for several steps first), gradients that accumulate because
``zero_grad()`` is missing (stale gradients at each step's first backward), or nothing at all,
when a healthy run meets a log of 0 in the loss or a sqrt at 0 in a backward. Each cause gets a
score from the figures that support it; the first one is named in the error and the finding.
No device read: only :class:`StepRecord`s the sentinel already holds.

Two rules keep the ranking honest (issue 25):

- **where it appeared comes first.** A non-finite value that appeared in the data, or in an input
  of the loss that is not the model's output (a target made in preprocessing), is that cause,
  ahead of any dynamics cause: no learning rate makes a batch non-finite.
- **every figure agrees with its words.** The update/weight ratio read as evidence is the one
  ``update_ratio`` judges: over the layer weights (biases start at 0, where a ratio means
  nothing), one global ratio per optimizer on the rows it stepped; a ratio inside the band is
  never called "above" it. Stale gradients are read per optimizer where there are several (a
  GAN's generator holds its previous gradients until its own ``zero_grad()``, by design).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from .._collect.probes.norms import GradNorms, StaleGradients, WeightNorms
from .._collect.probes.updates import UpdateNorms
from .._record import StepRecord

__all__ = ["Cause", "Trends", "rank_causes", "trends"]

#: Growth over the recent steps that is not noise: a weight norm or learning rate x10, an
#: activation or gradient magnitude x100, a loss x2 (the ``diverging`` factor).
_LR_GROWTH = 10.0
_WEIGHT_GROWTH = 10.0
_MAGNITUDE_GROWTH = 100.0
_LOSS_GROWTH = 2.0


@dataclasses.dataclass
class Cause:
    """One candidate cause: a stable name, its score, a sentence, and the figures behind it."""

    name: str
    score: float
    text: str
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.name, "score": self.score, "text": self.text, "evidence": self.evidence}


def _growth(series: list[tuple[int, float]]) -> Optional[tuple[float, int, int, float, float]]:
    """(last/first, first step, last step, first, last) of a positive finite series."""
    s = [(k, v) for k, v in series if math.isfinite(v) and v > 0]
    if len(s) < 2:
        return None
    (k0, v0), (k1, v1) = s[0], s[-1]
    return v1 / v0, k0, k1, v0, v1


@dataclasses.dataclass
class Trends:
    """Series over the recent steps, each as (step, value)."""

    lr: list[tuple[int, float]]
    loss: list[tuple[int, float]]
    weight_norm: list[tuple[int, float]]
    grad_norm: list[tuple[int, float]]
    act_absmax: list[tuple[int, float]]
    update_ratio: list[tuple[int, float, str]]
    stale: list[tuple[int, float]]
    steps: list[int]


def global_ratios(rec: StepRecord, weights: Optional[set[str]] = None,
                  groups: Sequence[Sequence[str]] = ()) -> list[tuple[float, str]]:
    """(global update/weight ratio, whose) per optimizer that stepped in ``rec`` and whose update
    was measured: over the layer ``weights`` it holds (all parameters when ``weights`` is None)."""
    updates, par = rec.fact(UpdateNorms), rec.fact(WeightNorms)
    if updates is None or par is None:
        return []
    u, w = updates.by_name(), par.by_name()
    owned = [list(g) for g in groups] if len(groups) > 1 else [list(u)]
    out = []
    for i, names in enumerate(owned):
        if len(groups) > 1 and i not in rec.meta.stepped:
            continue
        chosen = [n for n in names if (weights is None or n in weights) and w.get(n, 0) > 0 and n in u]
        uu = np.array([u[n] for n in chosen], dtype=np.float64)
        ww = np.array([w[n] for n in chosen], dtype=np.float64)
        if not chosen or not (np.isfinite(uu).all() and np.isfinite(ww).all()):
            continue
        who = f"optimizer {i}'s layer weights" if len(groups) > 1 else "the layer weights"
        out.append((float(np.sqrt((uu**2).sum() / (ww**2).sum())), who))
    return out


def _stale(rec: StepRecord, several: bool) -> Optional[float]:
    """The norm of gradients left over from an optimizer's previous step at this step (None:
    none). With several optimizers only an optimizer's own gradients count."""
    if several:
        from ..detectors.missing_zero_grad import (
            StaleByOptimizer,  # the fact lives with its detector
        )

        per = rec.fact(StaleByOptimizer)
        if per is None:
            return None
        values = [v for v in per.values.tolist() if v > 0 or not math.isfinite(v)]
        return max(values) if values else None
    stale = rec.fact(StaleGradients)
    if stale is None or not (stale.norm > 0 or not math.isfinite(stale.norm)):
        return None
    return stale.norm


def trends(records: Sequence[StepRecord], before_step: int, weights: Optional[set[str]] = None,
           groups: Sequence[Sequence[str]] = ()) -> Trends:
    """The trends of the rows before ``before_step`` (finite values only). ``weights`` are the
    layer weights the update/weight ratio is read over (all parameters when None); ``groups``
    the parameter names of each optimizer."""
    t = Trends([], [], [], [], [], [], [], [])
    several = len(groups) > 1
    for rec in records:
        if rec.step >= before_step or rec.meta.amp_skipped:
            continue
        m = rec.meta
        t.steps.append(rec.step)
        lrs = [lr for lr in m.lrs if lr is not None]
        if lrs:
            t.lr.append((rec.step, max(lrs)))
        loss = rec.loss
        if loss is not None and math.isfinite(loss):
            t.loss.append((rec.step, loss))
        grads = rec.fact(GradNorms) if m.backward_calls else None
        if grads is not None and grads.values.size and np.isfinite(grads.values).all():
            t.grad_norm.append((rec.step, grads.total))
        par = rec.fact(WeightNorms)
        if par is not None and par.values.size and np.isfinite(par.values).all():
            t.weight_norm.append((rec.step, float(np.sqrt((par.values**2).sum()))))
        ratios = global_ratios(rec, weights, groups)
        if ratios:
            ratio, who = max(ratios)
            t.update_ratio.append((rec.step, ratio, who))
        lo, hi = rec.array("act.min"), rec.array("act.max")
        touched = hi >= lo
        if touched.any():
            amp = np.maximum(np.abs(lo[touched]), np.abs(hi[touched])).astype(np.float64)
            if np.isfinite(amp).all():
                t.act_absmax.append((rec.step, float(amp.max())))
        stale = _stale(rec, several)
        if stale is not None:
            t.stale.append((rec.step, stale))
    return t


def _median_growth(series: list[tuple[int, float]], n: int = 3) -> Optional[tuple[float, float, float]]:
    """(growth, start, end): the median of the last n values over the median of the first n, so
    one noisy batch neither makes nor hides a trend."""
    vals = [v for _, v in series if math.isfinite(v) and v > 0]
    if len(vals) < 2:
        return None
    k = min(n, max(1, len(vals) // 2))
    a, b = float(np.median(vals[:k])), float(np.median(vals[-k:]))
    return (b / a if a > 0 else math.inf), a, b


def rank_causes(boundary: str, detail: dict[str, Any], records: Sequence[StepRecord],
                before_step: int, band: tuple[float, float] = (1e-7, 0.1),
                local: str = "", weights: Optional[set[str]] = None,
                groups: Sequence[Sequence[str]] = (),
                moved: Sequence[tuple[str, float, float]] = ()) -> list[Cause]:
    """Likely causes of a non-finite value at ``before_step``, most likely first.

    Args:
        boundary: where the non-finite value appeared (``forward``, ``loss``, ...).
        detail: the fault's detail (module type, whether stale gradients were non-finite).
        records: the recent rows the sentinel already holds, oldest first.
        before_step: the step of the fault; only rows before it are evidence.
        band: the healthy update/weight ratio band (``update_ratio.low``, ``update_ratio.high``).
        local: the sentence describing the boundary's own local cause (a log of 0 in the loss, a
            sqrt at 0 in a backward); it wins when no trend points elsewhere.
        weights: the layer weights the update/weight ratio is read over (``update_ratio``'s).
        groups: the parameter names of each optimizer (the ratio and stale gradients are read
            per optimizer where there are several).
        moved: ``(parameter, norm after its last update, norm now)`` of the weights whose norm
            changed 2x or more with no optimizer step in between (the spike ring's last row),
            for a fault those weights could have made (``NonFiniteDiagnosis`` decides which).
    """
    t = trends(records, before_step, weights, groups)
    causes: list[Cause] = []

    # learning rate: the lr itself grew, the updates were too large, and what they feed grew.
    lr_score = 0.0
    lr_ev: dict[str, Any] = {}
    lr_txt: list[str] = []
    g = _growth(t.lr)
    if g is not None and g[0] >= _LR_GROWTH:
        lr_score += 3
        lr_ev["lr_growth"] = g[0]
        lr_txt.append(f"the learning rate grew {g[0]:.3g}x ({g[3]:.3g} at step {g[1]} to {g[4]:.3g} at step {g[2]})")
    if t.update_ratio:
        step, ratio, who = t.update_ratio[-1]
        lr_ev["update_ratio"] = {"step": step, "ratio": ratio, "of": who, "band": list(band)}
        if ratio > band[1]:
            lr_score += 2
            lr_txt.append(f"the update/weight ratio of {who} at step {step} was {ratio:.3g}, above the "
                          f"healthy band [{band[0]:.0e}, {band[1]:.3g}]")
    for key, series, lim, what in (("weight_norm_growth", t.weight_norm, _WEIGHT_GROWTH, "the weights' norm"),
                                   ("activation_growth", t.act_absmax, _MAGNITUDE_GROWTH, "the largest activation"),
                                   ("grad_norm_growth", t.grad_norm, _MAGNITUDE_GROWTH, "the gradient norm")):
        mg = _median_growth(series)
        if mg is not None and mg[0] >= lim:
            lr_score += 1
            lr_ev[key] = mg[0]
            lr_txt.append(f"{what} grew {mg[0]:.3g}x ({mg[1]:.3g} to {mg[2]:.3g})")
    lg = _median_growth(t.loss)
    if lg is not None and lg[0] >= _LOSS_GROWTH:
        lr_score += 1
        lr_ev["loss_growth"] = lg[0]
        lr_txt.append(f"the loss rose {lg[0]:.3g}x ({lg[1]:.4g} to {lg[2]:.4g})")

    # accumulating gradients: stale gradients at the first backward of consecutive steps.
    acc_score = 0.0
    acc_ev: dict[str, Any] = {}
    if t.stale or str(detail.get("present", "")).startswith("non-finite gradients carried over"):
        acc_score = 1.0 + 1.5 * min(len(t.stale), 3)
        if str(detail.get("present", "")).startswith("non-finite gradients carried over"):
            acc_score += 3
        acc_ev = {"stale_steps": [s for s, _ in t.stale][:8],
                  "stale_grad_norm": [v for _, v in t.stale][:8]}
        if lr_score and "grad_norm_growth" in lr_ev:
            acc_ev["grad_norm_growth"] = lr_ev["grad_norm_growth"]
    if acc_score:
        steps = acc_ev["stale_steps"]
        causes.append(Cause(
            "accumulating_gradients", acc_score,
            "gradients accumulate across optimizer steps: gradients from the previous step were "
            f"still present at the first backward of step(s) {steps[:6]}, so every step applies the "
            "sum of all past gradients until they blow up (zero_grad() missing, e.g. inside an "
            "LBFGS closure)", acc_ev))
        lr_score = max(0.0, lr_score - 2)  # the growth is explained by the accumulation

    if lr_score:
        causes.append(Cause(
            "learning_rate", lr_score,
            "the learning rate is too high for this model: " + "; ".join(lr_txt), lr_ev))

    where = detail.get("loss_input_nonfinite")
    if boundary == "data" or where == "target":
        # where it appeared comes first: no learning rate makes a batch (or a target) non-finite
        what = "the batch itself was non-finite" if boundary == "data" else (
            "a target fed to the loss was already non-finite: it comes from the data or its "
            "preprocessing (a log of 0, a division by a zero count), not from the model")
        causes.insert(0, Cause("data", 100.0, local if boundary == "data" and local else what,
                               {"where": boundary if boundary == "data" else "loss target"}))
    else:
        # the boundary's own local cause: likely when nothing in the run was growing
        causes.append(Cause("local_" + boundary, 1.5, local or f"the computation at the {boundary} boundary", {}))
    if moved:
        # A weight rewritten between two optimizer steps (a flipped bit, a bad load, surgery):
        # whatever this step computed from it, the fault starts there, not where it surfaced.
        # (The caller passes it only for faults the weights as they are now could have made.)
        name, before, now = moved[0]
        others = f" ({len(moved) - 1} more)" if len(moved) > 1 else ""
        causes.append(Cause(
            "weights_changed", 50.0,
            f"weight {name!r}{others} changed from norm {before:.3g} after the optimizer's last step to "
            f"{now:.3g} before the next one, with no optimizer step in between: something other than the "
            "optimizer wrote it (a corrupted value or flipped bit, a checkpoint load, weight surgery, code "
            "that edits weights between steps); the non-finite values start there",
            {"weights": [{"parameter": n, "norm_after_last_step": a, "norm_now": b} for n, a, b in moved[:8]]}))
    causes.sort(key=lambda c: -c.score)
    return causes
