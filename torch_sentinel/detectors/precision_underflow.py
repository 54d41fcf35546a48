"""``precision_underflow``: a tensor's small values flush to zero in the format the run computes in.

Reads :class:`~torch_sentinel.precision.probe.PrecisionRows` for the run's own format (bf16/fp16
weights or autocast; a float32 run has none, and is never reported). The figure is the share
of a tensor's nonzero values that round to 0 (``derive.flushed_share``): exact where the tensor
is finer than the format (float32 values an fp16 op will take in), extrapolated from the values
sitting at the format's smallest subnormal where the tensor was already rounded to it (fp16
gradients: what fell below is among the zeros by now). The textbook case is fp16 gradients
without a GradScaler; with one, gradients are measured times its scale, as backward computed
them, and stay clear.

Severity: ``warning`` for gradients (flushed gradient entries are updates lost); ``info`` for
activations (a forward value below fp16's subnormals is usually negligible next to the rest).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Iterable

from .._findings import Finding
from .._record import StepRecord
from ..precision.formats import FORMATS
from ..precision.monitor import PrecisionRow
from ..precision.probe import PrecisionRows
from .base import Detector, Threshold

__all__ = ["PrecisionUnderflowDetector"]


class PrecisionUnderflowDetector(Detector):
    kind = "precision_underflow"
    rung = "gradients"
    next_check = "scale_the_loss_or_use_bf16"
    hypothesis = "values are too small for the format the run computes in, so they round to zero"
    reads = (PrecisionRows,)
    thresholds = {
        "fraction": Threshold(0.01, "issue 23: 1% of the nonzero values; low on purpose: loss scaling "
                                    "(Micikevicius et al., 2018) exists because fp16 flushes small "
                                    "gradients, and a scaled run keeps this share near 0"),
        "min_samples": Threshold(3, "sampled steps, median share: one unusual batch does not decide"),
    }

    def setup(self) -> None:
        self.fraction = self.threshold("fraction")
        self.min_samples = int(self.threshold("min_samples"))
        self._shares: dict[tuple[str, str], collections.deque[PrecisionRow]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._found: list[Finding] = []

    def update(self, record: StepRecord) -> None:
        fact = record.fact(PrecisionRows)
        if fact is None:
            return
        for row in fact.rows:
            key = (row.module, row.tensor)
            if not row.compute or key in self._reported:
                continue
            window = self._shares.setdefault(key, collections.deque(maxlen=self.min_samples))
            window.append(row)
            if len(window) < self.min_samples:
                continue
            median = statistics.median(r.flushed_share for r in window)
            if median >= self.fraction:
                self._reported.add(key)
                self._found.append(self._finding(list(window), median))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        found, self._found = self._found, []
        return found

    def _finding(self, window: list[PrecisionRow], median: float) -> Finding:
        row = window[-1]
        fmt = FORMATS[row.format]
        mtype = self.ctx.module_types.get(row.module, "")
        what = f"{row.tensor}s of {row.module or '<model>'}" + (f" ({mtype})" if mtype else "")
        how = ("" if row.flushed_basis == "cast" else
               f" (extrapolated from the values at {row.format}'s smallest subnormal {fmt.min_subnormal:.3g}:"
               " the tensor was already rounded to it)")
        text = (f"{median:.1%} of the nonzero {what} flush to zero in {row.format}, the format this run "
                f"computes in, over {len(window)} sampled steps{how}" + (f"; |max| {row.amax:.3g}" if row.amax else ""))
        if row.tensor == "gradient":
            text += ": those entries update nothing. Scale the loss (torch.amp.GradScaler) or compute in bf16"
        finding = self.finding(
            text, module=row.module, step=row.step, onset_step=window[0].step,
            severity="warning" if row.tensor == "gradient" else "info",
            evidence={"format": row.format, "tensor": row.tensor, "amax": row.amax,
                      "headroom_bits": row.headroom_bits, "flushed": median,
                      "flushed_basis": row.flushed_basis, "subnormal": row.subnormal,
                      "steps": [r.step for r in window], "threshold": self.fraction},
        )
        return finding if row.tensor == "gradient" else dataclasses.replace(finding, boundary="forward")
