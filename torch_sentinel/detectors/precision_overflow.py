"""``precision_overflow``: a tensor's largest magnitude is on course to pass a format's maximum.

Reads :class:`~torch_sentinel.precision.probe.PrecisionRows` (module outputs at the ``forward``
rung, parameter gradients at ``gradients``). A row fires when its ``amax`` trend, a log-linear
fit over the last sampled steps (``precision/trend.py``), reaches the format's overflow edge
within ``horizon`` steps, to within ``max_error`` steps and extrapolating at most
``extrapolation`` times the span it was fitted over; or when some of its values are past the
edge already.

Severity: ``warning`` for the format the run computes in (bf16/fp16 weights or autocast): the
values will turn into inf there (fp16, e5m2) or be clamped (e4m3). ``info`` for a format the
run only watches (``attach(precision=...)`` on a float32 run): it is what a cast to that
format would meet. Gradients measured under a GradScaler are never reported: the scaler
raises its scale until they overflow, and skips those steps, by design.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Optional

from .._findings import Finding
from .._record import StepRecord
from ..precision.formats import FORMATS
from ..precision.monitor import PrecisionRow
from ..precision.probe import PrecisionRows
from .base import Detector, Threshold

__all__ = ["PrecisionOverflowDetector"]


class PrecisionOverflowDetector(Detector):
    kind = "precision_overflow"
    rung = "forward"
    next_check = "inspect_value_growth_and_learning_rate"
    hypothesis = "values grow by a steady factor per step and will pass the format's largest value"
    reads = (PrecisionRows,)
    thresholds = {
        "horizon": Threshold(100, "steps ahead: time to act (lower the learning rate, rescale) while a trend "
                                  "measured over the last sampled steps still holds; TransformerEngine's "
                                  "delayed scaling looks back over up to 1,024 steps"),
        "max_error": Threshold(1, "steps: the prediction's standard error (trend.Crossing), so the predicted "
                                  "step is right to +-2 at two standard errors; a noisy series waits"),
        "extrapolation": Threshold(2, "times the fitted span of steps: early training grows fast and levels "
                                      "off (an MNIST convnet's activations grow x1.2 a step over steps 5-10, "
                                      "x1.01 by step 40)"),
    }

    def setup(self) -> None:
        self.horizon = int(self.threshold("horizon"))
        self.max_error = self.threshold("max_error")
        self.extrapolation = self.threshold("extrapolation")
        self._reported: set[tuple[str, str]] = set()
        self._pending: list[tuple[PrecisionRow, Optional[str]]] = []

    def update(self, record: StepRecord) -> None:
        fact = record.fact(PrecisionRows)
        if fact is None:
            return
        due = [r for r in fact.rows if self._in_reach(r)]
        # The format the run computes in first, then the nearest overflow.
        due.sort(key=lambda r: (r.step, not r.compute, r.steps_to_overflow))
        for row in due:
            key = (row.module, row.tensor)
            if key not in self._reported:
                self._reported.add(key)
                self._pending.append((row, fact.compute_format))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        found, self._pending = self._pending, []
        return [self._finding(row, compute) for row, compute in found]

    def _in_reach(self, row: PrecisionRow) -> bool:
        ahead = row.steps_to_overflow
        if ahead is None or ahead > self.horizon:
            return False
        if ahead == 0:
            return True  # already past the edge: a count, not a prediction
        return ((row.overflow_error or 0.0) <= self.max_error
                and ahead <= self.extrapolation * (row.trend_span or 0))

    def _finding(self, row: PrecisionRow, compute: Optional[str]) -> Finding:
        fmt = FORMATS[row.format]
        mtype = self.ctx.module_types.get(row.module, "")
        what = f"the {row.tensor}s of {row.module or '<model>'}" + (f" ({mtype})" if mtype else "")
        headroom = f"{row.headroom_bits:.1f} bits of headroom" if row.headroom_bits is not None else "no headroom"
        if row.steps_to_overflow == 0:
            text = (f"{row.saturated:.2%} of {what} already round above {row.format}'s largest value "
                    f"{fmt.max_finite:g} at step {row.step} (|max| {_number(row.amax)})")
        else:
            text = (f"the largest |value| among {what} grows steadily ({_number(row.amax)} at step {row.step}, "
                    f"{headroom}): it is predicted to pass {row.format}'s largest value {fmt.max_finite:g} "
                    f"at step {row.predicted_overflow_step}, {row.steps_to_overflow} steps ahead")
        if row.compute:
            text += f"; this run computes in {row.format}, so those values will " + (
                "be clamped to the largest value" if fmt.saturating else "turn into inf")
        else:
            text += (f"; this run computes in {compute or 'float32'}: the figures are for a cast to "
                     f"{row.format}")
        finding = self.finding(
            text, module=row.module, step=row.step, severity="warning" if row.compute else "info",
            evidence={"format": row.format, "tensor": row.tensor, "amax": row.amax,
                      "headroom_bits": row.headroom_bits, "predicted_overflow_step": row.predicted_overflow_step,
                      "saturated": row.saturated, "prediction_error": row.overflow_error,
                      "horizon": self.horizon},
        )
        return finding if row.tensor == "activation" else dataclasses.replace(finding, boundary="gradients")


def _number(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4g}"
