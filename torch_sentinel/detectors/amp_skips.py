"""``amp_skips``: the AMP GradScaler skips step after step, so the model never trains.

A few skipped steps are healthy: the scaler starts at 2**16 and halves its scale on each skip
until the scaled gradients fit. Halving from 2**16 reaches 2**-14 (fp16's smallest normal) in
30 skips, so ``amp_skips.consecutive`` = 30 skips in a row means no scale fits: the gradients
themselves are inf/NaN at every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from .._collect.records import StepRecord
from .._findings import Finding
from ._common import threshold
from .base import Detector, RunContext

__all__ = ["AmpSkipsDetector"]


class AmpSkipsDetector(Detector):
    kind = "amp_skips"
    boundary = "gradients"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"consecutive": 30}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.consecutive = int(threshold(self, "consecutive"))
        self._run_start = -1
        self._run_len = 0
        self._skipped = 0
        self._steps = 0
        self._reported = False

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        for rec in records:
            self._steps += 1
            if rec.meta.amp_skipped:
                self._skipped += 1
                self._run_start = rec.step if self._run_len == 0 else self._run_start
                self._run_len += 1
            else:
                self._run_len = 0
            if not self._reported and self._run_len >= self.consecutive:
                self._reported = True
                scale = rec.value("misc", "amp_scale")
                return [self.finding(
                    f"the GradScaler skipped {self._run_len} optimizer steps in a row (steps "
                    f"{self._run_start}-{rec.step}; scale now {scale:.3g}): the unscaled "
                    "gradients are non-finite at every step, so no update is ever applied",
                    step=rec.step, severity="error",
                    evidence={"consecutive_skips": self._run_len, "first_step": self._run_start,
                              "skipped_total": self._skipped, "steps": self._steps, "scale": scale},
                    next_check="inspect_backward_path",
                )]
        return []

    def statistics(self) -> dict[str, float]:
        return {"skipped_fraction": self._skipped / self._steps} if self._steps else {}
