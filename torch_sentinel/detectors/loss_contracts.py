"""``invalid_loss_input`` and ``invalid_target``: a loss fed inputs or targets outside its contract.

The contracts, their clauses and their figures live in ``torch_sentinel/losses/``; this file is
the thin adapter from the :class:`Detector` API to the plain :class:`ContractJudge`, which reads
numbers only: each record's :class:`LossCalls` (host facts) with the :class:`LossFigures` the
row holds for them. ``probabilities_as_logits`` and ``loss_broadcast`` are two more clauses of
the same table, with their own stable kinds (their files subclass :class:`ContractDetector`).

Rungs: ``invalid_loss_input`` is a ``loss`` fault (what the model hands the loss is the wrong
kind of quantity for it). ``invalid_target`` is a ``data`` fault: a target outside its domain
(a 0-255 mask, {0, 1} labels for a {-1, 1} loss, index lists that are masks) is wrong before
any layer runs, its fix is in the data pipeline, and every later rung (loss, gradients, curves)
inherits it, so the ladder names it first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Optional

from .._collect.loss_inputs import CompiledLoss, LossCalls, LossFigures
from .._findings import Finding
from .._record import Fact, StepRecord
from ..losses.calls import LossCall
from ..losses.verdicts import ContractJudge, Limits, Verdict
from .base import Detector, Threshold

__all__ = ["ContractDetector", "InvalidLossInputDetector", "InvalidTargetDetector"]

_THRESHOLDS = {
    "tolerance": Threshold(1e-3, "the largest |row sum - 1| or |log-sum-exp| of a float32 tensor read as "
                                 "normalised: float32 softmax rows are within ~1e-6 (float16/bfloat16 get 2e-2)"),
    "min_probes": Threshold(3, "probed steps breaking a clause, and half of those probed (steps 0-4, then every "
                               "10th): one odd batch never decides; a fault from the start is reported at step 9"),
}


def _step_calls(calls: Iterable[LossCall]) -> list[LossCall]:
    """One call per (loss, site) of a step: calls of one site share their folded figures, so
    the last speaks for them."""
    last: dict[tuple[str, str], LossCall] = {}
    for call in calls:
        last[(call.loss, call.site)] = call
    return list(last.values())


class ContractDetector(Detector):
    """One kind of the loss contracts: feeds the judge, reports the verdicts of its kind."""

    reads: ClassVar[tuple[type[Fact], ...]] = (LossCalls, LossFigures, CompiledLoss)

    def setup(self) -> None:
        self.judge = ContractJudge(self.limits())

    def limits(self) -> Limits:
        """This kind's thresholds (``attach(thresholds={"<kind>.tolerance": ...})``)."""
        return Limits(tolerance=self.threshold("tolerance"), min_probes=int(self.threshold("min_probes")))

    def update(self, record: StepRecord) -> None:
        calls = record.fact(LossCalls)
        if calls is None or record.meta.amp_skipped:
            return
        figures = record.fact(LossFigures)
        for call in _step_calls(calls.calls):
            self.judge.update(call, figures.of(call.block) if figures is not None and call.block else {})

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if final:  # a loop that never stepped: the host facts of the step in progress
            seen = self.ctx.in_progress().facts.get(LossCalls)
            for call in _step_calls(seen.calls if isinstance(seen, LossCalls) else ()):
                self.judge.update(call, {})
        return [self.to_finding(v) for v in self.judge.conclude() if v.kind == self.kind]

    def to_finding(self, v: Verdict) -> Finding:
        return self.finding(v.message, module=v.module, step=v.step, onset_step=v.onset, severity=v.severity,
                            evidence=v.evidence)


class InvalidLossInputDetector(ContractDetector):
    kind = "invalid_loss_input"
    rung = "loss"
    explains = ("diverging", "plateau")  # a loss fed the wrong quantity cannot be minimised as meant
    next_check = "fix_the_loss_input_domain"
    hypothesis = ("the loss is given a quantity outside its input domain (scores for log-probabilities, a rate "
                  "for a log-rate, classes on another dim)")
    thresholds = _THRESHOLDS


class InvalidTargetDetector(ContractDetector):
    kind = "invalid_target"
    rung = "data"
    explains = ("diverging", "plateau")  # targets outside the loss's domain: no sane minimum to reach
    next_check = "inspect_targets_against_the_loss"
    hypothesis = "the targets are outside the loss's target domain (scale, sign convention, format)"
    thresholds = _THRESHOLDS


def blind(detector: Detector, step: Optional[int], watched: Iterable[str], kinds: list[str]) -> Finding:
    """The one ``info`` finding that a loss computed inside compiled code is not watched."""
    names = ", ".join(f"F.{name}" for name in watched)
    return detector.finding(
        f"{', '.join(kinds)} do not watch this run's loss: it is computed inside compiled code (the loss "
        f"reaching backward is a compiled graph's output, and no call of {names} was made outside it), "
        "where those calls are traced, not seen. Everything else is watched. To check the loss inputs, "
        "compute the loss outside the compiled module, or run a few steps without torch.compile",
        step=step, severity="info",
        evidence={"not_watched": kinds, "reason": "torch.compile", "loss_functions_watched": list(watched)},
        next_check="run_a_few_steps_eagerly",
    )
