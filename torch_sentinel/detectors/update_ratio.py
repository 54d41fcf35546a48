"""``update_ratio``: the update/weight ratio ||dW|| / ||W|| far outside ~1e-3.

Measured exactly on the steps where the collector copies the weights (every ``update_every``
steps), over the weights of Linear/Conv/RNN layers (biases start at 0, where the ratio means
nothing).

Between the sampled steps a lower bound comes for free: the weight norms are read before every
step (``param_norm``), and by the triangle inequality ``| ||W_k+1|| - ||W_k|| | <= ||dW_k||``. A
relative change of the weights' global norm above ``high`` on ``min_samples`` consecutive
observed steps proves the ratio is too high there, at a step that no sample may fall on (an lr
100x too high during a warm-up, after which Adam's weights have grown to match it and the
sampled ratio looks ordinary again). It can only prove "too high", never "too low". Weights
that start from nothing (zero or tiny init: a logistic regression from zeros) grow by large
relative steps at any lr, so the bound is read only for weights whose initial norm is not 0 and
while their norm is within ``_GROWN`` times what it was at the first step: beyond that the
weights are made of their updates, and a relative change says where they started, not how
large the lr is.

Thresholds (median over ``update_ratio.min_samples`` = 3 sampled steps):
- ``update_ratio.high`` = 0.1: DeepDiagnosis's upper bound on lr * ||dW|| / ||W||; 100x the
  rule-of-thumb 1e-3, where each step rewrites a tenth of the weight: the learning rate is
  too high;
- ``update_ratio.low`` = 1e-7: DeepDiagnosis's lower bound is 1e-5, but fine-tuning at small
  learning rates legitimately sits near 1e-5, so we only flag updates that float32 can barely
  represent. An exact 0 is ``no_update``'s business.
"""

from __future__ import annotations

import collections
import math
from typing import Optional

import numpy as np

from .._collect.probes.norms import WeightNorms
from .._collect.probes.updates import UpdateNorms
from .._findings import Finding
from .._record import StepRecord
from ._common import trained
from ._layers import layers
from .base import Detector, Threshold

__all__ = ["UpdateRatioDetector"]

#: The weights' global norm may have grown this many times over its first recorded value and
#: still be read for the lower bound: an order of magnitude (an lr 100x too high shows within 3x-7x).
_GROWN = 10.0


class UpdateRatioDetector(Detector):
    kind = "update_ratio"
    rung = "updates"
    next_check = "inspect_learning_rate"
    hypothesis = "the learning rate is out of scale with the weights"
    reads = (UpdateNorms, WeightNorms)
    thresholds = {
        "high": Threshold(0.1, "DeepDiagnosis's upper bound on lr*||dW||/||W||, 100x the 1e-3 rule of thumb"),
        "low": Threshold(1e-7, "DeepDiagnosis's 1e-5, lowered: fine-tuning sits near 1e-5 legitimately; "
                               "only updates float32 can barely represent"),
        "min_samples": Threshold(3, "sampled steps, median: one step never decides"),
    }

    def setup(self) -> None:
        self.high = self.threshold("high")
        self.low = self.threshold("low")
        self.min_samples = int(self.threshold("min_samples"))
        self._samples: collections.deque[tuple[int, float, str, float]] = collections.deque(maxlen=self.min_samples)
        self._weights: list[str] = []
        self._reported = False
        #: (step, weight norms by name) of the last row whose weights were recorded
        self._prev_norms: Optional[tuple[int, dict[str, float], bool]] = None
        #: (step, lower bound of the global ratio, layer weight with the largest one, its bound)
        self._bounds: collections.deque[tuple[int, float, str, float]] = collections.deque(maxlen=self.min_samples)
        #: each weight's norm at the first row that recorded it
        self._first: dict[str, float] = {}

    def update(self, record: StepRecord) -> None:
        if not trained(record):
            return
        if not self._weights:
            self._weights = [p for _, ps in layers(self.ctx) for p in ps if p in self.ctx.optimizer_params]
        rec = record
        found = self._lower_bound(rec)
        if found:
            self.flag(found[0])
            return
        updates, weights = rec.fact(UpdateNorms), rec.fact(WeightNorms)
        if updates is None or weights is None or not self._weights or not any(rec.meta.lrs):
            return
        upd, par = updates.by_name(), weights.by_name()
        skip = set(rec.meta.frozen) | set(rec.meta.grad_missing)
        names = [n for n in self._weights if n not in skip and par.get(n, 0) > 0]
        if not names:
            return
        u = np.array([upd[n] for n in names], dtype=np.float64)
        w = np.array([par[n] for n in names], dtype=np.float64)
        if not (np.isfinite(u).all() and np.isfinite(w).all()) or not u.any():
            return
        per = u / w
        i = int(np.argmax(per))
        self._samples.append((rec.step, float(math.sqrt((u**2).sum() / (w**2).sum())), names[i], float(per[i])))
        # Any run of min_samples consecutive samples out of bounds counts: Adam at a too-high
        # lr is most visible early, before the weights have grown to match it.
        if not self._reported and len(self._samples) == self.min_samples:
            found = self._check()
            if found:
                self.flag(found[0])

    def _lower_bound(self, rec: StepRecord) -> list[Finding]:
        """Fold in ``| ||W|| now - ||W|| before the previous step | / ||W|| before``, a lower
        bound of the previous step's update/weight ratio, when both rows read the weights."""
        weights = rec.fact(WeightNorms)
        if weights is None or not self._weights:
            return []
        par = weights.by_name()
        skip = set(rec.meta.frozen) | set(rec.meta.grad_missing)
        stepped = not rec.meta.amp_skipped and any(lr for lr in rec.meta.lrs if lr is not None)
        prev, self._prev_norms = self._prev_norms, (rec.step, {n: par[n] for n in self._weights if n not in skip}, stepped)
        for n in self._weights:
            self._first.setdefault(n, par[n])
        if prev is None or prev[0] != rec.step - 1 or not prev[2] or self._reported:
            return []
        names = [n for n in self._weights if prev[1].get(n, 0) > 0 and n in par and self._first[n] > 0]
        w0 = np.array([prev[1][n] for n in names], dtype=np.float64)
        w1 = np.array([par[n] for n in names], dtype=np.float64)
        first = np.array([self._first[n] for n in names], dtype=np.float64)
        if not names or not (np.isfinite(w0).all() and np.isfinite(w1).all() and np.isfinite(first).all()) \
                or (w0**2).sum() > _GROWN**2 * (first**2).sum():
            self._bounds.clear()  # nothing to read, or weights made of their updates by now
            return []
        per = np.abs(w1 - w0) / w0
        i = int(np.argmax(per))
        bound = abs(math.sqrt(float((w1**2).sum())) - math.sqrt(float((w0**2).sum()))) / math.sqrt(float((w0**2).sum()))
        self._bounds.append((prev[0], bound, names[i], float(per[i])))
        if len(self._bounds) < self.min_samples or min(b[1] for b in self._bounds) <= self.high:
            return []
        self._reported = True
        recent = list(self._bounds)
        worst = max(recent, key=lambda b: b[3])
        low = min(b[1] for b in recent)
        return [self.finding(
            f"the weights' norm changed by {', '.join(f'{b[1]:.0%}' for b in recent)} of itself in "
            f"steps {[b[0] for b in recent]}: the update/weight ratio ||dW||/||W|| was at least "
            f"{low:.3g} at each (a lower bound read from the weight norms before consecutive steps), "
            f"above the {self.high:g} bound (healthy training sits near 1e-3; the largest change is "
            f"{worst[2]!r}'s, {worst[3]:.0%}): the learning rate is likely too high",
            module=self.ctx.owner(worst[2]), step=recent[-1][0] + 1, onset_step=recent[0][0],
            severity="warning",
            evidence={"ratio": low, "ratio_at_least": low, "steps": [b[0] for b in recent],
                      "lower_bounds": [b[1] for b in recent], "largest_param": worst[2],
                      "largest_lower_bound": worst[3], "bound": self.high,
                      "measured": "weight norms before consecutive steps (lower bound)"},
            next_check="lower_learning_rate",
        )]

    def _check(self) -> list[Finding]:
        recent = list(self._samples)
        ratio = float(np.median([s[1] for s in recent]))
        if self.low <= ratio <= self.high:
            return []
        self._reported = True
        high = ratio > self.high
        worst = max(recent, key=lambda s: s[3])
        return [self.finding(
            f"the update/weight ratio ||dW||/||W|| was {ratio:.3g} (median of {len(recent)} sampled "
            f"steps), {'above' if high else 'below'} the {self.high if high else self.low:g} "
            f"bound (healthy training sits near 1e-3): the learning rate is likely too {'high' if high else 'low'}",
            module=self.ctx.owner(worst[2]) if high else None, step=recent[-1][0], severity="warning",
            evidence={"ratio": ratio, "steps": [s[0] for s in recent], "ratios": [s[1] for s in recent],
                      "largest_param": worst[2], "largest_ratio": worst[3],
                      "bound": self.high if high else self.low},
            next_check="lower_learning_rate" if high else "raise_learning_rate",
        )]
