"""The sentinel's global scalars and findings, for a training framework's own logging.

The Lightning and Hugging Face callbacks add a :class:`FrameworkSink` to their sentinel. It
only keeps what each flushed window brings (host numbers, never a device read), so handing the
values on costs no host sync: the callbacks take them at the sentinel's flushes or at the
framework's own log cadence, and pass them to ``logger.log_metrics`` / ``Trainer.log``.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Optional

from .._findings import Finding
from .._record import StepRecord
from .step_scalars import StepScalars

__all__ = ["METRICS", "FrameworkSink"]

#: TensorBoard tag -> the framework metric name it is logged under.
METRICS = {
    "loss/train": "sentinel/loss",
    "grad_norm/global": "sentinel/grad_norm",
    "grad_norm/global_clipped": "sentinel/grad_norm_clipped",
    "update_ratio/global": "sentinel/update_ratio",
}


class FrameworkSink:
    """Keeps the global scalars of the steps flushed since the last :meth:`take`.

    Metrics per step: ``sentinel/loss`` (the loss ``backward()`` saw), ``sentinel/grad_norm``
    (global gradient norm before clipping), ``sentinel/grad_norm_clipped`` (after clipping,
    where the loop clipped), ``sentinel/update_ratio`` (on sampled steps),
    ``sentinel/nonfinite`` (non-finite evidence slots over every boundary) and
    ``sentinel/findings`` (findings so far).

    Args:
        param_owner: parameter name -> owning module, as the sentinel's ``context`` has it.
        max_rows: rows kept between takes; older ones are dropped (a framework that never
            takes them must not grow memory).
    """

    def __init__(self, param_owner: dict[str, str], max_rows: int = 1024) -> None:
        self._scalars = StepScalars(param_owner)
        self._rows: collections.deque[tuple[StepRecord, int]] = collections.deque(maxlen=max_rows)
        self._findings: list[Finding] = []
        self.findings_total = 0

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None:
        self.findings_total += len(findings)
        self._findings.extend(findings)
        for r in records:
            self._rows.append((r, self.findings_total))

    def close(self) -> None:
        return None

    @property
    def latest_step(self) -> Optional[int]:
        """The sentinel step of the newest row not yet taken."""
        return self._rows[-1][0].step if self._rows else None

    def take(self) -> list[tuple[int, dict[str, float]]]:
        """``(sentinel step, metrics)`` of every row since the last take, oldest first."""
        rows, self._rows = list(self._rows), collections.deque(maxlen=self._rows.maxlen)
        return [(r.step, self.metrics(r, n)) for r, n in rows]

    def take_findings(self) -> list[Finding]:
        """The findings that arrived since the last call."""
        found, self._findings = self._findings, []
        return found

    def metrics(self, record: StepRecord, findings_total: Optional[int] = None) -> dict[str, float]:
        out: dict[str, float] = {}
        nonfinite = 0.0
        for tag, value in self._scalars.scalars(record, [], module_tags=False):
            if tag in METRICS:
                out[METRICS[tag]] = value
            elif tag.startswith("nonfinite/"):
                nonfinite += value
        out["sentinel/nonfinite"] = nonfinite
        out["sentinel/findings"] = float(
            self.findings_total if findings_total is None else findings_total
        )
        return out
