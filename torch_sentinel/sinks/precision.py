"""``precision.jsonl``: one JSON object per line, per tensor, format and sampled step.

The rows of the records' :class:`~torch_sentinel.precision.probe.PrecisionRows` facts
(``monitor.ROW_FIELDS``), written as each window reaches the sinks.
``torch-sentinel precision RUN_DIR`` reads them back. The file is created with the first row: a
run that watches no format (a float32 run by default) leaves none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import IO, Optional

from .._findings import Finding
from .._record import StepRecord
from ..precision.monitor import PrecisionRow
from ..precision.probe import PrecisionRows
from .base import SinkContext

__all__ = ["PRECISION_FIGURES", "PRECISION_FILE", "PrecisionFileSink", "precision_scalars"]

PRECISION_FILE = "precision.jsonl"

#: The figures of a precision row written to TensorBoard.
PRECISION_FIGURES = ("flushed", "subnormal", "saturated", "headroom_bits")


def precision_scalars(row: PrecisionRow, module: str) -> Iterator[tuple[str, float]]:
    """A precision row's TensorBoard tags and values: ``precision/<format>/<module>/<figure>``,
    with ``grad/`` before the figure for gradients (a figure that is None, such as the headroom
    of an all-zero tensor, is left out).

    Args:
        row: the row.
        module: the module's name as tags spell it (``step_scalars.module_tag``).
    """
    prefix = f"precision/{row.format}/{module}/" + ("grad/" if row.tensor == "gradient" else "")
    for name in PRECISION_FIGURES:
        value = getattr(row, name)
        if value is not None:
            yield prefix + name, float(value)


class PrecisionFileSink:
    """Appends precision rows to ``log_dir/precision.jsonl`` (a rerun in the same directory
    appends, as the other files do)."""

    def __init__(self, ctx: SinkContext) -> None:
        assert ctx.log_dir is not None
        self.ctx = ctx
        self.path = os.path.join(ctx.log_dir, PRECISION_FILE)
        self._file: Optional[IO[str]] = None
        self._failed = False

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None:
        rows: list[PrecisionRow] = []
        for record in records:
            fact = record.fact(PrecisionRows)
            if fact is not None:
                rows.extend(fact.rows)
        if self._failed or not rows:
            return
        try:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives until close()
            self._file.write("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
            self._file.flush()
        except OSError as exc:
            self._failed = True
            self.ctx.log_dir_failure(f"writing {PRECISION_FILE}", exc)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._failed = True
                self.ctx.log_dir_failure(f"writing {PRECISION_FILE}", exc)
            self._file = None
