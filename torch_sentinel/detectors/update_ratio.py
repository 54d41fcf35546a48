"""``update_ratio``: the update/weight ratio ||dW|| / ||W|| far outside ~1e-3.

Measured exactly on the steps where the collector copies the weights (every ``update_every``
steps), over the weights of Linear/Conv/RNN layers (biases start at 0, where the ratio means
nothing). With several optimizers (a GAN's two networks), each optimizer is judged on its own
weights, on the rows where it stepped: a ratio of one network's update over both networks'
weights says nothing about either learning rate.

Between the sampled steps a lower bound comes for free: the weight norms are read before every
step (``param_norm``), and by the triangle inequality ``| ||W_k+1|| - ||W_k|| | <= ||dW_k||``. A
relative change of the weights' global norm above ``high`` on ``min_samples`` consecutive
observed steps proves the ratio is too high there, at a step that no sample may fall on (an lr
100x too high during a warm-up, after which Adam's weights have grown to match it and the
sampled ratio looks ordinary again). It can only prove "too high", never "too low". Weights
that start from nothing (zero init: a logistic regression from zeros) grow by large relative
steps at any lr, so the bound is read only for weights whose initial norm is not 0 and while
their norm is within ``_GROWN`` times what it was at the first step.

A ratio out of band is a claim about the learning rate, and the loss history must support it
(``_evidence.py``): "too high" needs the loss to rise beyond its own noise band or go
non-finite (a large update on a loss that falls fast is productive: a small model fitting an
easy function, Adam's first steps on weights initialised very small); "too low" needs slow
progress since the low ratios began, and is never said of an optimizer whose ratio was ever
above the band (a network whose gradient died after an oversized step updates by almost
nothing: the learning rate is not too low there). A claim the loss history does not support is
given as ``severity="info"`` with what the history showed.

Thresholds (median over ``update_ratio.min_samples`` = 3 sampled steps):
- ``update_ratio.high`` = 0.1: DeepDiagnosis's upper bound on lr * ||dW|| / ||W||; 100x the
  rule-of-thumb 1e-3, where each step rewrites a tenth of the weight: the learning rate is
  too high;
- ``update_ratio.low`` = 1e-7: DeepDiagnosis's lower bound is 1e-5, but fine-tuning at small
  learning rates legitimately sits near 1e-5, so we only flag updates that float32 can barely
  represent. An exact 0 is ``no_update``'s business.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._collect.probes.norms import WeightNorms
from .._collect.probes.updates import UpdateNorms
from .._findings import Finding
from .._record import StepRecord
from ._common import trained
from ._evidence import LossHistory, Support
from ._layers import layers
from ._ratios import Claim, OptimizerRatios
from .base import Detector, Threshold

__all__ = ["UpdateRatioDetector"]


class UpdateRatioDetector(Detector):
    kind = "update_ratio"
    rung = "updates"
    next_check = "inspect_learning_rate"
    hypothesis = "the learning rate is out of scale with the weights"
    explains = ("diverging", "exploding_gradient", "plateau")  # oversized (or vanishing) steps
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
        self.loss = LossHistory()
        self._groups: list[OptimizerRatios] = []
        #: Claims waiting for the loss history to decide them, in the order they were made.
        self._pending: list[Claim] = []
        self._peak_lr = 0.0
        self._lr_now = 0.0

    def _build_groups(self) -> list[OptimizerRatios]:
        weights = [p for _, ps in layers(self.ctx) for p in ps if p in self.ctx.optimizer_params]
        groups = self.ctx.optimizer_groups
        if len(groups) < 2:
            return [OptimizerRatios(-1, weights, self.high, self.low, self.min_samples)]
        return [OptimizerRatios(i, [w for w in weights if w in set(names)], self.high, self.low, self.min_samples)
                for i, names in enumerate(groups)]

    def update(self, record: StepRecord) -> None:
        self.loss.add(record)
        lrs = [lr for lr in record.meta.lrs if lr is not None]
        if lrs:
            self._lr_now = max(lrs)
            self._peak_lr = max(self._peak_lr, self._lr_now)
        if trained(record):
            if not self._groups:
                self._groups = self._build_groups()
            for group in self._groups:
                claim = group.update(record)
                if claim is not None:
                    self._pending.append(claim)
        self._decide(final=False)

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if final:
            self._decide(final=True)
        return []

    def _decide(self, final: bool) -> None:
        still: list[Claim] = []
        for claim in self._pending:
            support = self._support(claim)
            if not support.decided and not final:
                still.append(claim)
                continue
            self.flag(self._finding(claim, support))
        self._pending = still

    def _support(self, claim: Claim) -> Support:
        if claim.high:
            return self.loss.too_high(claim.onset)
        lr_fell = self._peak_lr / self._lr_now if self._lr_now > 0 else None
        return self.loss.too_low(claim.onset, lr_fell=lr_fell)

    def _finding(self, claim: Claim, support: Support) -> Finding:
        direction = "high" if claim.high else "low"
        if support.warns:
            verdict = f"the learning rate is likely too {direction}; {support.reason}"
            severity = "warning"
        elif support.verdict == "undecided":
            verdict = (f"too few losses to tell whether the learning rate is too {direction} "
                       f"({support.reason})")
            severity = "info"
        else:
            verdict = (f"but the loss history does not say the learning rate is too {direction}: "
                       f"{support.reason}")
            severity = "info"
        evidence: dict[str, Any] = {**claim.evidence, **support.evidence()}
        if claim.optimizer >= 0:
            evidence["optimizer"] = claim.optimizer
        module = self.ctx.owner(claim.param) if claim.high else None
        return self.finding(
            f"{claim.text}: {verdict}", module=module, step=max(claim.step, self.loss.last_step or 0)
            if severity == "warning" else claim.step, onset_step=claim.onset, severity=severity,
            evidence=evidence, next_check="lower_learning_rate" if claim.high else "raise_learning_rate",
        )
