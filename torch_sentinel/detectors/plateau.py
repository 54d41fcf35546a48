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
from collections.abc import Iterable, Sequence
from typing import ClassVar, Optional

from .._collect.loss_inputs import LossInputs
from .._collect.probe import Probe
from .._collect.records import StepRecord
from .._findings import Finding
from ._common import threshold
from ._curve import SmoothedLoss
from .base import Detector, RunContext

__all__ = ["PlateauDetector"]


class PlateauDetector(Detector):
    kind = "plateau"
    boundary = "curves"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_steps": 30, "improvement": 0.03}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.min_steps = int(threshold(self, "min_steps"))
        self.improvement = threshold(self, "improvement")
        self.loss = SmoothedLoss()
        self._inputs: Optional[LossInputs] = LossInputs.shared(ctx.extras)
        self._reported = False

    def probes(self) -> Sequence[Probe]:
        return (self._inputs,) if self._inputs is not None else ()

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        self.loss.add(records)
        return [] if self._reported else self._verdict()

    def finish(self) -> Iterable[Finding]:
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
        classes = self._inputs.classes if self._inputs is not None else None
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
            next_check="inspect_learning_rate_and_capacity",
        )]
