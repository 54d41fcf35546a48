"""``precision_overflow``: a tensor's largest magnitude is on course to pass a format's maximum.

Reads the rows of :class:`~torch_sentinel.precision.monitor.PrecisionMonitor` (module outputs at
the ``forward`` rung, parameter gradients at ``gradients``). A row fires when its ``amax``
trend, a log-linear fit over the last sampled steps (``precision/trend.py``), reaches the
format's overflow edge within ``horizon`` steps, or when some of its values are already past it.

Severity: ``warning`` for the format the run computes in (bf16/fp16 weights or autocast): the
values will turn into inf there (fp16, e5m2) or be clamped (e4m3). ``info`` for a format the
run only watches (``attach(precision=...)`` on a float32 run): it is what a cast to that
format would meet. Gradients measured under a GradScaler are never reported: the scaler
raises its scale until they overflow, and skips those steps, by design.

Thresholds:
- ``precision_overflow.horizon`` = 100 steps: TransformerEngine's delayed scaling looks back
  over up to 1,024 steps; 100 steps ahead leaves time to act (lower the learning rate, rescale)
  while a trend measured over the last sampled steps still holds.
- ``precision_overflow.max_error`` = 1 step: the prediction's standard error (``trend.Crossing``)
  must be at most one step, so the predicted step is right within +-2 steps at two standard
  errors. A noisy or short series waits for more samples; a clean trend is reported at once.
- ``precision_overflow.extrapolation`` = 2: the predicted step lies at most twice the fitted
  span of steps beyond the last sample. Early training grows fast and then levels off (an MNIST
  convnet's activations grow x1.2 a step over steps 5-10 and x1.01 by step 40): a line through
  the first ten steps says nothing about step 60.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar, Optional

from .._collect.records import StepRecord
from .._findings import Finding
from ..precision.formats import FORMATS
from ..precision.monitor import PrecisionRow
from ._common import threshold
from .base import Detector, RunContext

__all__ = ["PrecisionOverflowDetector"]


class PrecisionOverflowDetector(Detector):
    kind = "precision_overflow"
    boundary = "forward"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"horizon": 100, "max_error": 1, "extrapolation": 2}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.horizon = int(threshold(self, "horizon"))
        self.max_error = threshold(self, "max_error")
        self.extrapolation = threshold(self, "extrapolation")
        self._reported: set[tuple[str, str]] = set()

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        monitor = self.ctx.precision
        if monitor is None:
            return []
        due = [r for r in monitor.fresh if self._due(r)]
        # The format the run computes in first, then the nearest overflow.
        due.sort(key=lambda r: (r.step, not r.compute, r.steps_to_overflow))
        found = []
        for row in due:
            key = (row.module, row.tensor)
            if key not in self._reported:
                self._reported.add(key)
                found.append(self._finding(row, monitor.compute_format))
        return found

    def _due(self, row: PrecisionRow) -> bool:
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
        return Finding(
            kind=self.kind, boundary="forward" if row.tensor == "activation" else "gradients",
            message=text, module=row.module, step=row.step,
            severity="warning" if row.compute else "info",
            evidence={"format": row.format, "tensor": row.tensor, "amax": row.amax,
                      "headroom_bits": row.headroom_bits, "predicted_overflow_step": row.predicted_overflow_step,
                      "saturated": row.saturated, "prediction_error": row.overflow_error,
                      "horizon": self.horizon},
            next_check="inspect_value_growth_and_learning_rate", rank=self.ctx.rank,
        )


def _number(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4g}"
