"""The update/weight ratio of one optimizer's layer weights, sampled and bounded (``update_ratio``).

One :class:`OptimizerRatios` per optimizer (one for the whole model with a single optimizer):
its weights, on the rows where it stepped, give a sampled ratio (from ``UpdateNorms``) and a
lower bound between samples (from ``WeightNorms`` before consecutive steps). When either leaves
the band it makes a :class:`Claim`, which the detector then holds against the loss history.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Optional

import numpy as np

from .._collect.probes.norms import WeightNorms
from .._collect.probes.updates import UpdateNorms
from .._record import StepRecord
from ._robust import median

__all__ = ["Claim", "OptimizerRatios"]

#: The weights' global norm may have grown this many times over its first recorded value and
#: still be read for the lower bound: an order of magnitude (an lr 100x too high shows within 3x-7x).
_GROWN = 10.0


@dataclasses.dataclass(frozen=True)
class Claim:
    """An update/weight ratio out of band: what it says, its figures, and where it began."""

    high: bool
    #: The sentence stating the figures (the verdict on the learning rate is added to it).
    text: str
    onset: int
    step: int
    #: The layer weight with the largest ratio (its owner is the finding's module when high).
    param: str
    optimizer: int
    evidence: dict[str, Any]


class OptimizerRatios:
    """Sampled ratios and lower bounds of one optimizer's layer weights (``index`` -1: the only
    optimizer, or none)."""

    def __init__(self, index: int, weights: list[str], high: float, low: float, min_samples: int) -> None:
        self.index = index
        self.weights = weights
        self.high = high
        self.low = low
        self.min_samples = min_samples
        #: (step, global ratio, layer weight with the largest ratio, its ratio)
        self.samples: collections.deque[tuple[int, float, str, float]] = collections.deque(maxlen=min_samples)
        self.bounds: collections.deque[tuple[int, float, str, float]] = collections.deque(maxlen=min_samples)
        #: (row, weight norms by name) of the last row whose weights were recorded and it stepped
        self.prev_norms: Optional[tuple[int, int, dict[str, float]]] = None
        self.first: dict[str, float] = {}
        #: Whether a ratio or bound of this optimizer was ever above the band: its ratio is then
        #: never called low (a gradient that died after oversized steps updates by almost nothing).
        self.ever_high = False
        self.claimed_high = False
        self.claimed_low = False

    def _stepped(self, rec: StepRecord) -> bool:
        return self.index < 0 or self.index in rec.meta.stepped

    def update(self, rec: StepRecord) -> Optional[Claim]:
        if not self.weights or not self._stepped(rec):
            return None
        claim = self._lower_bound(rec)
        if claim is not None:
            return claim
        return self._sample(rec)

    def _sample(self, rec: StepRecord) -> Optional[Claim]:
        updates, weights = rec.fact(UpdateNorms), rec.fact(WeightNorms)
        if updates is None or weights is None or not any(lr for lr in rec.meta.lrs if lr is not None):
            return None
        upd, par = updates.by_name(), weights.by_name()
        skip = set(rec.meta.frozen) | set(rec.meta.grad_missing)
        names = [n for n in self.weights if n not in skip and par.get(n, 0) > 0]
        if not names:
            return None
        u = np.array([upd[n] for n in names], dtype=np.float64)
        w = np.array([par[n] for n in names], dtype=np.float64)
        if not (np.isfinite(u).all() and np.isfinite(w).all()) or not u.any():
            return None  # nothing measured for this optimizer on this row
        per = u / w
        i = int(np.argmax(per))
        ratio = float(math.sqrt((u**2).sum() / (w**2).sum()))
        self.samples.append((rec.step, ratio, names[i], float(per[i])))
        if ratio > self.high:
            self.ever_high = True
        if len(self.samples) < self.min_samples:
            return None
        recent = list(self.samples)
        middle = median([s[1] for s in recent])
        worst = max(recent, key=lambda s: s[3])
        evidence = {"ratio": middle, "steps": [s[0] for s in recent], "ratios": [s[1] for s in recent],
                    "largest_param": worst[2], "largest_ratio": worst[3]}
        of = f" of optimizer {self.index}'s weights" if self.index >= 0 else ""
        if middle > self.high and not self.claimed_high:
            self.claimed_high = True
            return Claim(True, f"the update/weight ratio ||dW||/||W||{of} was {middle:.3g} (median of "
                               f"{len(recent)} sampled steps), above the {self.high:g} bound (healthy "
                               "training sits near 1e-3)", recent[0][0], recent[-1][0], worst[2], self.index,
                         {**evidence, "bound": self.high})
        if middle < self.low and not self.ever_high and not self.claimed_low and not self.claimed_high:
            self.claimed_low = True
            return Claim(False, f"the update/weight ratio ||dW||/||W||{of} was {middle:.3g} (median of "
                                f"{len(recent)} sampled steps), below the {self.low:g} bound (healthy "
                                "training sits near 1e-3)", recent[0][0], recent[-1][0], worst[2], self.index,
                         {**evidence, "bound": self.low})
        return None

    def _lower_bound(self, rec: StepRecord) -> Optional[Claim]:
        """Fold in ``| ||W|| now - ||W|| before the previous step | / ||W|| before``, a lower
        bound of the previous step's update/weight ratio, when both rows read the weights."""
        weights = rec.fact(WeightNorms)
        if weights is None:
            return None
        par = weights.by_name()
        skip = set(rec.meta.frozen) | set(rec.meta.grad_missing)
        stepped = not rec.meta.amp_skipped and any(lr for lr in rec.meta.lrs if lr is not None)
        prev = self.prev_norms
        self.prev_norms = (rec.meta.row, rec.step, {n: par[n] for n in self.weights if n not in skip}) if stepped else None
        for n in self.weights:
            self.first.setdefault(n, par[n])
        if prev is None or prev[0] != rec.meta.row - 1 or self.claimed_high:
            return None
        names = [n for n in self.weights if prev[2].get(n, 0) > 0 and n in par and self.first[n] > 0]
        w0 = np.array([prev[2][n] for n in names], dtype=np.float64)
        w1 = np.array([par[n] for n in names], dtype=np.float64)
        first = np.array([self.first[n] for n in names], dtype=np.float64)
        if not names or not (np.isfinite(w0).all() and np.isfinite(w1).all() and np.isfinite(first).all()) \
                or (w0**2).sum() > _GROWN**2 * (first**2).sum():
            self.bounds.clear()  # nothing to read, or weights made of their updates by now
            return None
        per = np.abs(w1 - w0) / w0
        i = int(np.argmax(per))
        bound = abs(math.sqrt(float((w1**2).sum())) - math.sqrt(float((w0**2).sum()))) / math.sqrt(float((w0**2).sum()))
        self.bounds.append((prev[1], bound, names[i], float(per[i])))
        if bound > self.high:
            self.ever_high = True
        if len(self.bounds) < self.min_samples or min(b[1] for b in self.bounds) <= self.high:
            return None
        self.claimed_high = True
        recent = list(self.bounds)
        worst = max(recent, key=lambda b: b[3])
        low = min(b[1] for b in recent)
        of = f" of optimizer {self.index}" if self.index >= 0 else ""
        return Claim(
            True,
            f"the weights' norm{of} changed by {', '.join(f'{b[1]:.0%}' for b in recent)} of itself in "
            f"steps {[b[0] for b in recent]}: the update/weight ratio ||dW||/||W|| was at least "
            f"{low:.3g} at each (a lower bound read from the weight norms before consecutive steps), "
            f"above the {self.high:g} bound (healthy training sits near 1e-3; the largest change is "
            f"{worst[2]!r}'s, {worst[3]:.0%})",
            recent[0][0], recent[-1][0] + 1, worst[2], self.index,
            {"ratio": low, "ratio_at_least": low, "steps": [b[0] for b in recent],
             "lower_bounds": [b[1] for b in recent], "largest_param": worst[2],
             "largest_lower_bound": worst[3], "bound": self.high,
             "measured": "weight norms before consecutive steps (lower bound)"},
        )
