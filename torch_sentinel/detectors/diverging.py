"""``diverging``: the training loss climbs instead of falling, before any NaN.

Thresholds (on 5-step running medians):
- ``diverging.factor`` = 2: the current loss is at least twice the lowest loss reached, and
- it is above the loss at the start (a run that learned and then spiked briefly back below its
  starting point is noisy, not diverging);
- the climb must hold for 3 consecutive smoothed points (a 2-step spike is not divergence).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._collect.records import StepRecord
from .._findings import Finding
from ._curve import SmoothedLoss
from .base import Detector, RunContext

__all__ = ["DivergingDetector"]

_HOLD = 3


class DivergingDetector(Detector):
    kind = "diverging"
    boundary = "curves"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.factor = ctx.threshold("diverging.factor", 2.0)
        self.loss = SmoothedLoss()
        self._run = 0
        self._reported = False

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        for step, now in self.loss.add(records):
            if self._reported:
                continue
            start, low = self.loss.start or 0.0, self.loss.low or 0.0
            bad = low > 0 and now >= self.factor * low and now > start
            self._run = self._run + 1 if bad else 0
            if self._run >= _HOLD:
                self._reported = True
                return [self.finding(
                    f"the training loss climbed to {now:.4g} (5-step median at step {step}) from "
                    f"a low of {low:.4g} and a start of {start:.4g}",
                    step=step, severity="error",
                    evidence={"start_loss": start, "lowest_loss": low, "loss_at_detection": now,
                              "factor": now / low, "steps_observed": self.loss.count},
                    next_check="lower_learning_rate",
                )]
        return []
