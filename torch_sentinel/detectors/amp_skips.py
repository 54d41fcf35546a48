"""``amp_skips``: the AMP GradScaler skips step after step, so the model never trains.

A few skipped steps are healthy: the scaler starts at 2**16 and halves its scale on each skip
until the scaled gradients fit. Halving from 2**16 reaches 2**-14 (fp16's smallest normal) in
30 skips, so ``amp_skips.consecutive`` = 30 skips in a row means no scale fits: the gradients
themselves are inf/NaN at every step.
"""

from __future__ import annotations

from .._collect.amp import LossScale
from .._record import StepRecord
from .base import Detector, Threshold

__all__ = ["AmpSkipsDetector"]


class AmpSkipsDetector(Detector):
    kind = "amp_skips"
    rung = "gradients"
    next_check = "inspect_backward_path"
    hypothesis = "gradients are non-finite at every step, so the scaler never applies an update"
    explains = ("plateau", "no_update")  # skipped steps update nothing
    reads = (LossScale,)
    thresholds = {"consecutive": Threshold(30, "2**16 halved to fp16's smallest normal (2**-14) in 30 skips")}

    def setup(self) -> None:
        self.consecutive = int(self.threshold("consecutive"))
        self._run_start = -1
        self._run_len = 0
        self._skipped = 0
        self._steps = 0
        self._reported = False

    def update(self, record: StepRecord) -> None:
        self._steps += 1
        if record.meta.amp_skipped:
            self._skipped += 1
            self._run_start = record.step if self._run_len == 0 else self._run_start
            self._run_len += 1
        else:
            self._run_len = 0
        if self._reported or self._run_len < self.consecutive:
            return
        self._reported = True
        scaled = record.fact(LossScale)
        scale = scaled.scale if scaled is not None else float("nan")
        self.flag(self.finding(
            f"the GradScaler skipped {self._run_len} optimizer steps in a row (steps "
            f"{self._run_start}-{record.step}; scale now {scale:.3g}): the unscaled "
            "gradients are non-finite at every step, so no update is ever applied",
            step=record.step, severity="error",
            evidence={"consecutive_skips": self._run_len, "first_step": self._run_start,
                      "skipped_total": self._skipped, "steps": self._steps, "scale": scale},
        ))

    def statistics(self) -> dict[str, float]:
        return {"skipped_fraction": self._skipped / self._steps} if self._steps else {}
