"""``plateau``: the training loss does not improve, including a loss stuck at chance level.

"Learning has stalled" is a claim about the loss history, judged like with like: the median of
the first and of the last equal windows of the history (``_evidence.LossHistory.change``), in
units of the loss's own noise band. The run has stalled when the fall between them is
confidently below ``plateau.improvement`` = 3% of the loss's magnitude: even the fall's upper
bound (the measured fall plus ``STALL_Z`` = 2 standard errors) stays under the bar. A noisy loss
whose windows cannot tell a 5% fall from a 1% one is not called stuck. Two things are not
evidence of a stall:

- the learning-rate warm-up: while the lr is still rising, the run has not had its chance, so
  the history starts at the first step whose lr did not rise (a fine-tune whose loss sits at
  ln 2 until its warm-up ends);
- a slow start: a stall seen at ``plateau.min_steps`` = 30 steps of history must still hold 10
  steps later, over the longer history (InfoNCE sits at chance for its first ~40 steps at the
  published rates, then falls).

A run that learned and then levelled off is converging, not stuck (its first window is far above
its last), and a rising loss is ``diverging``'s business. Chance level: for
``cross_entropy``/``nll_loss`` over C classes, a loss within 5% of ln(C) is what a model that
ignores its input scores; the evidence says so.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .._collect.loss_inputs import LossCalls
from .._findings import Finding
from .._record import StepRecord
from ._evidence import LossHistory
from .base import Detector, Threshold

__all__ = ["PlateauDetector"]

#: Steps a stall must still hold after it was first seen (a slow start shows progress by then).
_CONFIRM = 10
#: First losses of the judged history kept for good (the size of the largest window).
_HEAD = 10
#: Losses between two judgements while no stall is pending (host time: a median over 256 values).
_EVERY = 5
#: Standard errors added to the measured fall for its upper bound (~95%).
STALL_Z = 2.0


class PlateauDetector(Detector):
    kind = "plateau"
    rung = "curves"
    next_check = "inspect_learning_rate_and_capacity"
    hypothesis = "learning has stalled"
    reads = (LossCalls,)
    thresholds = {
        "min_steps": Threshold(30, "steps of history before a run can be called stuck"),
        "improvement": Threshold(0.03, "DeepDiagnosis flags a loss unchanged over 5 checks; "
                                       "a 3% bar on 5-step medians tolerates batch noise"),
    }

    def setup(self) -> None:
        self.min_steps = int(self.threshold("min_steps"))
        self.improvement = self.threshold("improvement")
        self.loss = LossHistory()
        #: Classes seen by cross_entropy / nll_loss (for "stuck at chance level").
        self._classes: Optional[int] = None
        self._reported = False
        #: The first step of the history judged: after the last step whose lr rose.
        self._since: Optional[int] = None
        self._lr: Optional[float] = None
        #: (step, history length) where a stall was first seen; it must hold 10 steps later.
        self._candidate: Optional[tuple[int, int]] = None
        #: The first losses of the history judged (since ``_since``), kept for good: the bounded
        #: history forgets them, and a run that learned long ago is converging, not stuck.
        self._head: list[tuple[int, float]] = []
        self._count = 0

    def update(self, record: StepRecord) -> None:
        self.loss.add(record)
        lrs = [lr for lr in record.meta.lrs if lr is not None]
        if lrs:
            lr = max(lrs)
            if self._lr is not None and lr > self._lr:
                self._since = record.step + 1  # still warming up (or restarting): not evidence yet
                self._candidate = None
                self._head = []
                self._count = 0
            self._lr = lr
        calls = record.fact(LossCalls)
        if calls is not None and calls.classes is not None:
            self._classes = calls.classes
        loss = record.loss
        if loss is not None and math.isfinite(loss) and not record.meta.amp_skipped \
                and (self._since is None or record.step >= self._since):
            self._count += 1
            if len(self._head) < _HEAD:
                self._head.append((record.step, loss))
        # judged every _EVERY losses (and at each step while a stall waits for its confirmation)
        due = self._candidate is not None or self._count % _EVERY == 0
        if not self._reported and record.loss is not None and self._count >= self.min_steps and due:
            for found in self._verdict():
                self.flag(found)

    def _verdict(self) -> list[Finding]:
        """Judged at every step (a stall must hold for ``_CONFIRM`` more steps, whatever the
        flush cadence)."""
        if self.ctx.adversarial():
            return []  # an adversarial loss (a GAN's) is not meant to fall (core scoping)
        steps, values = self.loss.span(self._since)
        n = self._count
        change = self.loss.change(self._since)
        if n < self.min_steps or change is None:
            return []
        if len(values) < n:  # the history forgot the first losses: compare with the kept head
            change = self.loss.change_from(self._head, self._since)
            if change is None:
                return []
            steps = np.concatenate([[self._head[0][0]], steps])
        start, now = change.before, change.after
        fell = start - now
        # Stalled only if the fall is confidently below the bar: even at its upper bound (two
        # standard errors of the loss's own noise) it stays under `improvement` of the loss.
        bound = fell + STALL_Z * (change.se if math.isfinite(change.se) else 0.0)
        if bound >= self.improvement * abs(start) or now > start + 0.1 * abs(start):
            self._candidate = None
            return []
        if self._candidate is None:
            self._candidate = (int(steps[-1]), n)
        if n < self._candidate[1] + _CONFIRM:
            return []
        classes = self._classes
        chance = math.log(classes) if classes and classes > 1 else None
        at_chance = chance is not None and abs(now - chance) <= 0.05 * chance
        self._reported = True
        where = f", stuck at chance level ln({classes}) = {chance:.4g}" if at_chance and chance else ""
        sigma = self.loss.noise(self._since)
        return [self.finding(
            f"the training loss did not improve over {n} steps (steps {int(steps[0])}-{int(steps[-1])}): "
            f"{change.describe()}, a change of {-fell / abs(start) if start else 0.0:+.2%} and "
            f"{change.z:.3g} standard errors of its own noise ({sigma:.3g} per step){where}",
            step=int(steps[-1]), onset_step=int(steps[0]), severity="warning",
            evidence={"start_loss": start, "last_loss": now, "relative_improvement": fell / abs(start) if start else 0.0,
                      "standard_errors": change.z, "noise_band": sigma, "steps_observed": n,
                      "first_step": int(steps[0]), "chance_loss": chance, "at_chance": at_chance},
        )]
