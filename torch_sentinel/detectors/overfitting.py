"""``overfitting``: the validation loss rises while the training loss keeps falling.

Thresholds:
- ``overfitting.rise`` = 0.1: the latest validation loss is at least 10% above its best;
- ``overfitting.patience`` = 2: at least two validation points after the best one (the usual
  early-stopping patience), so one unlucky validation pass is not a trend;
- the mean training loss since the best validation point is below its mean over as many
  stretches just before it: the training loss still falls while the validation loss rises.
  Compared with the whole run before the best point instead, any late stretch looks lower (the
  first steps' losses are in that mean), and a bump of both losses together (Adam on fresh
  data, where overfitting cannot happen) read as overfitting;
- a generalization gap: the latest validation loss is at least ``rise`` above the mean training
  loss since the best point. A model that fits its training data no better than held-out data
  is not overfitting, whatever its validation curve does (a noisy validation set, an lr bump).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .._findings import Finding
from .._record import StepRecord
from ._curve import ValidationCurve
from .base import Detector, Threshold

__all__ = ["OverfittingDetector"]


class OverfittingDetector(Detector):
    kind = "overfitting"
    rung = "curves"
    next_check = "investigate_generalization"
    hypothesis = "the model fits training noise"
    thresholds = {
        "rise": Threshold(0.1, "a 10% rise over the best validation loss (early-stopping practice)"),
        "patience": Threshold(2, "the usual early-stopping patience, in validation points"),
    }

    def setup(self) -> None:
        self.rise = self.threshold("rise")
        self.patience = int(self.threshold("patience"))
        self.history = ValidationCurve()
        self._reported = False

    def update(self, record: StepRecord) -> None:
        self.history.add(record)

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        return [] if self._reported else self._verdict()

    def _verdict(self) -> list[Finding]:
        h = self.history
        val = list(h.val)
        if len(val) < self.patience + 2:
            return []
        best = int(np.argmin(val))
        after = len(val) - 1 - best
        if after < self.patience or val[-1] < val[best] * (1 + self.rise):
            return []
        if min(val[-self.patience:]) < val[best] * (1 + self.rise / 2):
            return []  # the rise must hold over the last points, not be one bounce
        since = h.train_mean(best + 1, len(val) - 1)
        before = h.train_mean(max(0, best + 1 - after), best)
        if before is None or since is None or since >= before:
            return []
        if val[-1] < since * (1 + self.rise):
            return []  # no generalization gap: held-out data fares as well as training data
        self._reported = True
        steps = list(h.steps)
        return [self.finding(
            f"validation loss rose from {val[best]:.4g} (step {steps[best]}) to "
            f"{val[-1]:.4g} (step {steps[-1]}) while the training loss fell from "
            f"{before:.4g} to {since:.4g} (means)",
            step=steps[-1], severity="warning",
            evidence={"best_validation": val[best], "best_step": steps[best],
                      "last_validation": val[-1], "last_step": steps[-1],
                      "train_mean_before": before, "train_mean_since": since,
                      "validation_points": len(val)},
        )]
