"""Findings as log lines on the ``"torch_sentinel"`` logger: one line each, rate-limited."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Callable

from .._findings import Finding
from .._record import StepRecord
from ..diagnosis.ladder import next_check_for
from .base import SinkContext

__all__ = ["ConsoleSink"]

logger = logging.getLogger("torch_sentinel")

_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


class ConsoleSink:
    """One log line per finding, at the finding's severity.

    The Sentinel already reports each (kind, module) once; on top of that at most
    ``per_minute`` lines go out per minute, so a model with hundreds of layers cannot flood a
    job's log. What was held back is counted in the next line that goes out, and at close.
    """

    def __init__(
        self,
        ctx: SinkContext,
        *,
        per_minute: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.per_minute = per_minute
        self._clock = clock
        self._sent: list[float] = []
        self._suppressed = 0

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None:
        for f in findings:
            self._emit(_LEVELS[f.severity], format_finding(f))

    def write_note(self, entry: dict[str, Any]) -> None:
        fields = ", ".join(f"{k}={v}" for k, v in entry.items() if k not in ("kind", "step") and v)
        self._emit(logging.INFO, f"torch_sentinel note at step {entry.get('step')}: {fields}")

    def close(self) -> None:
        if self._suppressed:
            logger.warning(
                "torch_sentinel: %d more line(s) were held back by rate limiting; "
                "sentinel.report() has every finding",
                self._suppressed,
            )
            self._suppressed = 0

    def _emit(self, level: int, line: str) -> None:
        if not logger.isEnabledFor(level):
            return
        now = self._clock()
        self._sent = [t for t in self._sent if now - t < 60.0]
        if len(self._sent) >= self.per_minute:
            self._suppressed += 1
            return
        self._sent.append(now)
        if self._suppressed:
            line += f" ({self._suppressed} earlier line(s) held back by rate limiting)"
            self._suppressed = 0
        logger.log(level, "%s", line)


def format_finding(f: Finding) -> str:
    """``torch_sentinel: [warning] dead_relu (forward) in net.1 at step 20: ... -> next: ...``

    Multi-line messages (the non-finite report) are folded, so one finding is one line.
    """
    line = "; ".join(part.strip() for part in f"torch_sentinel: {f}".splitlines() if part.strip())
    if f.is_fault:
        line += f" -> next: {next_check_for([f])}"
    return line
