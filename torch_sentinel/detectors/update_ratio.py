"""``update_ratio``: the update/weight ratio ||dW|| / ||W|| far outside ~1e-3.

Measured exactly on the steps where the collector copies the weights (every ``update_every``
steps), over the weights of Linear/Conv/RNN layers (biases start at 0, where the ratio means
nothing).

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
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np

from .._collect.records import StepRecord
from .._findings import Finding
from ._common import threshold, trained_rows
from .base import Detector, RunContext
from .gradient_scale import _layers

__all__ = ["UpdateRatioDetector"]


class UpdateRatioDetector(Detector):
    kind = "update_ratio"
    boundary = "updates"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"high": 0.1, "low": 1e-7, "min_samples": 3}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.high = threshold(self, "high")
        self.low = threshold(self, "low")
        self.min_samples = int(threshold(self, "min_samples"))
        self._samples: collections.deque[tuple[int, float, str, float]] = collections.deque(maxlen=self.min_samples)
        self._weights: list[str] = []
        self._reported = False

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if not self._weights:
            self._weights = [p for _, ps in _layers(self.ctx) for p in ps if p in self.ctx.optimizer_params]
        for rec in trained_rows(records):
            if not rec.meta.updates_sampled or not self._weights or not any(rec.meta.lrs):
                continue
            upd, par = rec.mapping("update_norm"), rec.mapping("param_norm")
            skip = set(rec.meta.frozen) | set(rec.meta.grad_missing)
            names = [n for n in self._weights if n not in skip and par.get(n, 0) > 0]
            if not names:
                continue
            u = np.array([upd[n] for n in names], dtype=np.float64)
            w = np.array([par[n] for n in names], dtype=np.float64)
            if not (np.isfinite(u).all() and np.isfinite(w).all()) or not u.any():
                continue
            per = u / w
            i = int(np.argmax(per))
            self._samples.append((rec.step, float(math.sqrt((u**2).sum() / (w**2).sum())), names[i], float(per[i])))
            # Any run of min_samples consecutive samples out of bounds counts: Adam at a too-high
            # lr is most visible early, before the weights have grown to match it.
            if not self._reported and len(self._samples) == self.min_samples:
                found = self._check()
                if found:
                    return found
        return []

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

    def finish(self) -> Iterable[Finding]:
        return []
