"""``missing_zero_grad``: gradients accumulate across optimizer steps.

The collector measures, at the first ``backward()`` of each step, the norm of the gradients
already present: gradients left over from the previous step. ``zero_grad()`` (either flavour)
makes it 0 or None; accumulating micro-batches *within* a step is never counted, since only
the first backward of a step looks.

Thresholds: ``missing_zero_grad.min_steps`` = 3 consecutive steps carrying non-zero stale
gradients. With several optimizers (GANs) one optimizer's backward legitimately leaves
gradients on the other's parameters until that one clears them, so the check is skipped; so it
is when trainable parameters sit outside the optimizer (its zero_grad() never clears them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import ClassVar

from .._collect.probe import Probe, ProbeHost
from .._collect.records import StepRecord
from .._findings import Finding
from ._common import threshold, trained_rows
from .base import Detector, RunContext

__all__ = ["MissingZeroGradDetector"]


class MissingZeroGradDetector(Detector, Probe):
    """Reads ``misc.stale_grad_norm`` (``NormsProbe``); a probe only to see the host's facts at setup."""

    kind = "missing_zero_grad"
    boundary = "gradients"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_steps": 3}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.min_steps = int(threshold(self, "min_steps"))
        self._run: list[tuple[int, float, float]] = []
        self._reported = False
        self._enabled = True

    def setup(self, host: ProbeHost) -> None:
        # Trainable parameters outside the optimizer are never cleared by its zero_grad(); their
        # leftover gradients are unregistered_parameter's evidence, not a missing zero_grad().
        outside = any(p.requires_grad and n not in self.ctx.optimizer_params for n, p in host.params)
        # Without an optimizer each backward() is a step: a hand-written loop must clear the
        # gradients itself (model.zero_grad()), so the check applies there too.
        self._enabled = len(host.optimizers) <= 1 and not outside

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if not self._enabled or self._reported:
            return []
        for rec in trained_rows(records):
            if rec.step == 0:
                continue
            stale = rec.value("misc", "stale_grad_norm")
            if rec.meta.stale_grads and stale > 0 and math.isfinite(stale):
                grads = rec.array("grad_norm")
                total = float(math.sqrt(float((grads.astype("float64") ** 2).sum())))
                self._run.append((rec.step, stale, total))
            else:
                self._run = []
            if len(self._run) >= self.min_steps:
                self._reported = True
                steps = [r[0] for r in self._run]
                return [self.finding(
                    f"gradients from the previous step were still present at the first backward of "
                    f"{len(self._run)} consecutive steps (stale norm {self._run[-1][1]:.4g}): "
                    "zero_grad() is not called, so each step applies the sum of all past gradients",
                    module=None, step=steps[-1], severity="error",
                    evidence={"steps": steps, "stale_grad_norm": [r[1] for r in self._run],
                              "grad_norm_at_step": [r[2] for r in self._run]},
                    next_check="clear_gradients_every_step",
                )]
        return []
