"""``diverging``: the training loss climbs instead of falling, before any NaN.

Every verdict uses only the past: each smoothed point is judged against the start and the low
reached *up to that point*, never against values later in the flush window.

Two shapes of divergence, both on 5-step running medians held for 3 consecutive points (a
2-step spike is not divergence):
- a climb: the current loss is at least ``diverging.factor`` = 2 times the lowest loss reached
  so far, and above the loss at the start (a run that learned and then spiked briefly back
  below its starting point is noisy, not diverging);
- a jump from the first step that never comes back (an oversized learning rate): the first
  update already threw the loss up, so the first smoothed point holds the spike and the curve
  never rises above its own start. The reference is then the loss of step 0, the only one taken
  before any update: every loss since step 1 stayed at least ``diverging.factor`` times above it
  (the *smallest* of them, so one noisy first batch cannot raise the alarm on a run that learns).
"""

from __future__ import annotations

import math
from typing import Optional

from .._findings import Finding
from .._record import StepRecord
from ._curve import SMOOTH, SmoothedLoss
from .base import Detector, Threshold

__all__ = ["DivergingDetector"]

_HOLD = 3


class DivergingDetector(Detector):
    kind = "diverging"
    rung = "curves"
    next_check = "lower_learning_rate"
    hypothesis = "the optimization is unstable"
    thresholds = {"factor": Threshold(2.0, "a doubling of the smoothed loss over its low: no healthy "
                                            "curve doubles on 5-step medians held 3 points")}

    def setup(self) -> None:
        self.factor = self.threshold("factor")
        self.loss = SmoothedLoss()
        self._run = 0
        self._run_onset: Optional[int] = None
        self._reported = False
        # the pre-update reference: the first loss, and the smallest loss seen after it
        self._first: Optional[tuple[int, float]] = None
        self._after_min = math.inf
        self._after_count = 0

    def update(self, record: StepRecord) -> None:
        if self._reported or self.ctx.adversarial():
            return  # an adversarial loss (a GAN's) oscillates by design (core scoping)
        self._track_first(record)
        point = self.loss.add(record)
        if point is None:
            return
        found = self._judge(*point)
        if found is not None:
            self._reported = True
            self.flag(found)

    def _track_first(self, rec: StepRecord) -> None:
        loss = rec.loss
        if rec.meta.amp_skipped or loss is None or not math.isfinite(loss):
            return
        if self._first is None:
            self._first = (rec.step, loss)
        else:
            self._after_min = min(self._after_min, loss)
            self._after_count += 1

    def _judge(self, step: int, now: float, start: float, low: float) -> Optional[Finding]:
        bad = low > 0 and now >= self.factor * low and now > start
        if bad and self._run == 0:
            self._run_onset = step
        self._run = self._run + 1 if bad else 0
        if self._run >= _HOLD:
            return self.finding(
                f"the training loss climbed to {now:.4g} (5-step median at step {step}) from "
                f"a low of {low:.4g} and a start of {start:.4g}",
                step=step, onset_step=self._run_onset, severity="error",
                evidence={"start_loss": start, "lowest_loss": low, "loss_at_detection": now,
                          "factor": now / low, "steps_observed": self.loss.count},
            )
        first = self._first
        if first is None or first[1] <= 0 or self._after_count < SMOOTH + _HOLD - 1:
            return None
        if self._after_min >= self.factor * first[1]:
            return self.finding(
                f"the training loss jumped after the first update and never came back: step "
                f"{first[0]} (before any update) had {first[1]:.4g}, every loss of the "
                f"{self._after_count} steps since was at least {self._after_min:.4g} "
                f"({self._after_min / first[1]:.3g}x); 5-step median now {now:.4g} at step {step}",
                step=step, onset_step=first[0] + 1, severity="error",
                evidence={"first_loss": first[1], "first_step": first[0],
                          "lowest_loss_since": self._after_min, "loss_at_detection": now,
                          "factor": self._after_min / first[1], "steps_observed": self.loss.count},
            )
        return None
