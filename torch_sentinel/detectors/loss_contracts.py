"""``invalid_loss_input`` and ``invalid_target``: a loss fed inputs or targets outside its contract.

The contracts, their clauses and their figures live in ``torch_sentinel/losses/``; this file is
the thin adapter from today's :class:`Detector` to the plain :class:`ContractJudge`, which reads
numbers only. :class:`ContractFeed` pairs the probe's :class:`LossCall` facts with the figures
the step's record holds for them. ``probabilities_as_logits`` and ``loss_broadcast`` are two more
clauses of the same table, with their own stable kinds (their files subclass
:class:`ContractDetector`).

Rungs: ``invalid_loss_input`` is a ``loss`` fault (what the model hands the loss is the wrong
kind of quantity for it). ``invalid_target`` is a ``data`` fault: a target outside its domain
(a 0-255 mask, {0, 1} labels for a {-1, 1} loss, index lists that are masks) is wrong before
any layer runs, its fix is in the data pipeline, and every later rung (loss, gradients, curves)
inherits it, so the ladder must name it first.

Thresholds (both kinds):
- ``tolerance`` = 1e-3: the largest |row sum - 1| or |log-sum-exp| of a float32 tensor read as
  normalised (float32 softmax rows are within ~1e-6; float16/bfloat16 get 2e-2);
- ``min_probes`` = 3 probed steps breaking a clause, and at least half of those probed, before a
  figure-read clause is reported (steps 0-4 are probed, so a fault present from the start is
  reported at the first flush).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar, Optional

from .._collect.ledger import FLOAT_MAX
from .._collect.loss_inputs import LossInputs
from .._collect.probe import Probe
from .._collect.records import StepRecord
from .._findings import Finding
from ..losses.calls import LossCall
from ..losses.checks import folds_by_min
from ..losses.verdicts import ContractJudge, Limits, Verdict
from ._common import threshold
from .base import Detector, RunContext

__all__ = ["ContractDetector", "ContractFeed", "InvalidLossInputDetector", "InvalidTargetDetector"]

_NEXT = {
    "invalid_loss_input": "fix_the_loss_input_domain",
    "invalid_target": "inspect_targets_against_the_loss",
}


class ContractFeed:
    """The probe's committed calls, each with the figures its step's record holds (once per
    step and call site: calls of one site within a step share their folded figures). A call
    that measured nothing on the device is handed on at once."""

    def __init__(self) -> None:
        self._next = 0
        #: Which probe ``_next`` counts in (a restored checkpoint meets a fresh probe).
        self._source = 0
        self._waiting: list[LossCall] = []

    def take(self, inputs: Optional[LossInputs], records: Sequence[StepRecord]) -> list[tuple[LossCall, dict[str, Optional[float]]]]:
        if inputs is None:
            return []
        if self._source != id(inputs):
            self._source, self._next = id(inputs), 0
        total = inputs.dropped + len(inputs.calls)
        if total == self._next and not self._waiting:
            return []  # no call since the last window (most windows past step 100)
        start = max(self._next - inputs.dropped, 0)
        self._waiting += inputs.calls[start:]
        self._next = total
        out: list[tuple[LossCall, dict[str, Optional[float]]]] = []
        by_step = {rec.step: rec for rec in records if not rec.meta.amp_skipped}
        last = records[-1].step if records else None
        keep = []
        for call in self._waiting:
            rec = by_step.get(call.step)
            if not call.block:
                out.append((call, {}))  # host facts only: nothing to wait for
            elif rec is not None:
                out.append((call, _figures(call, rec)))
            elif last is None or call.step > last:
                keep.append(call)  # its row has not landed yet
        self._waiting = keep
        seen: dict[tuple[int, str, str], int] = {}
        for i, (call, _) in enumerate(out):
            seen[(call.step, call.loss, call.site)] = i  # the last call of a site in a step speaks for it
        return [out[i] for i in sorted(seen.values())]


def _figures(call: LossCall, rec: StepRecord) -> dict[str, Optional[float]]:
    if not call.block or not rec.has(call.block):
        return {}
    b = rec.blocks[call.block]
    if b.stop > len(rec.values):
        return {}
    out: dict[str, Optional[float]] = {}
    for i, name in enumerate(b.keys):
        raw = float(rec.values[b.start + i])
        out[name] = None if raw <= -0.5 * FLOAT_MAX else (-raw if folds_by_min(name) else raw)
    return out


class ContractDetector(Detector):
    """One kind of the loss contracts: feeds the judge, reports the verdicts of its kind."""

    thresholds: ClassVar[dict[str, float]] = {"tolerance": 1e-3, "min_probes": 3}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.judge = ContractJudge(self.limits())
        self.feed = ContractFeed()
        self._inputs: Optional[LossInputs] = LossInputs.shared(ctx.extras)

    def limits(self) -> Limits:
        """This kind's thresholds (``attach(thresholds={"<kind>.tolerance": ...})``)."""
        return Limits(tolerance=threshold(self, "tolerance"), min_probes=int(threshold(self, "min_probes")))

    def probes(self) -> Sequence[Probe]:
        return (self._inputs,) if self._inputs is not None else ()

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        for call, figures in self.feed.take(self._inputs, records):
            self.judge.update(call, figures)
        return [self.to_finding(v) for v in self.judge.conclude() if v.kind == self.kind]

    def finish(self) -> Iterable[Finding]:
        return self.observe(())

    def to_finding(self, v: Verdict) -> Finding:
        return self.finding(v.message, module=v.module, step=v.step, onset_step=v.onset, severity=v.severity,
                            evidence=v.evidence, next_check=_NEXT.get(self.kind))


class InvalidLossInputDetector(ContractDetector):
    kind = "invalid_loss_input"
    boundary = "loss"


class InvalidTargetDetector(ContractDetector):
    kind = "invalid_target"
    boundary = "data"
