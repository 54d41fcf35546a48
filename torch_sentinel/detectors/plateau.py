"""``plateau``: the training loss does not improve, including a loss stuck at chance level.

Thresholds (on 5-step running medians):
- ``plateau.min_steps`` = 30 steps of history;
- ``plateau.improvement`` = 0.03: the best smoothed loss is less than 3% below the first one,
  i.e. the run never learned (DeepDiagnosis flags a loss unchanged over 5 checks; a relative
  bar tolerates batch noise). A run that learned and then levelled off is converging, not
  stuck, and is not reported; nor is a rising loss (``diverging`` reports that).
- chance level: for ``cross_entropy``/``nll_loss`` over C classes, a loss within 5% of ln(C)
  is what a model that ignores its input scores; the evidence says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Optional

from .._collect.loss_inputs import LossCall
from .._findings import Finding
from .._record import StepRecord
from ._curve import SmoothedLoss
from .base import Detector, Threshold

__all__ = ["PlateauDetector"]


class PlateauDetector(Detector):
    kind = "plateau"
    rung = "curves"
    next_check = "inspect_learning_rate_and_capacity"
    hypothesis = "learning has stalled"
    reads = (LossCall,)
    thresholds = {
        "min_steps": Threshold(30, "steps of history before a run can be called stuck"),
        "improvement": Threshold(0.03, "DeepDiagnosis flags a loss unchanged over 5 checks; "
                                       "a 3% bar on 5-step medians tolerates batch noise"),
    }

    def setup(self) -> None:
        self.min_steps = int(self.threshold("min_steps"))
        self.improvement = self.threshold("improvement")
        self.loss = SmoothedLoss()
        #: Classes seen by cross_entropy / nll_loss (for "stuck at chance level").
        self._classes: Optional[int] = None
        self._reported = False

    def update(self, record: StepRecord) -> None:
        self.loss.add(record)
        call = record.fact(LossCall)
        if call is not None and call.classes is not None:
            self._classes = call.classes

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        return [] if self._reported else self._verdict()

    def _verdict(self) -> list[Finding]:
        L = self.loss
        if L.count < self.min_steps or L.start is None or L.low is None or L.now is None:
            return []
        if self.ctx.adversarial():
            return []  # an adversarial loss (a GAN's) is not meant to fall (core scoping)
        start, best, now = L.start, L.low, L.now
        if not (start > 0 and best > start * (1 - self.improvement)) or now > start * 1.1:
            return []
        classes = self._classes
        chance = math.log(classes) if classes and classes > 1 else None
        at_chance = chance is not None and abs(now - chance) <= 0.05 * chance
        self._reported = True
        where = f", stuck at chance level ln({classes}) = {chance:.4g}" if at_chance and chance else ""
        return [self.finding(
            f"the training loss did not improve over {L.count} steps: it started at "
            f"{start:.4g}, its best was {best:.4g} and it is now {now:.4g} (5-step medians){where}",
            step=L.step, severity="warning",
            evidence={"start_loss": start, "best_loss": best, "last_loss": now,
                      "relative_improvement": (start - best) / start, "steps_observed": L.count,
                      "chance_loss": chance, "at_chance": at_chance},
        )]
