"""Loss curves summarised on the host in bounded memory, for the curve detectors.

A run of a million steps must not grow the sentinel: the training loss is kept as a running
5-step median (the smoothing every curve verdict uses, so one noisy batch never decides), its
first value and its running minimum; validation points keep the mean training loss of the
stretch that led to them.
"""

from __future__ import annotations

import collections
import math
from typing import Optional

from .._record import StepRecord
from ._robust import median

__all__ = ["SmoothedLoss", "ValidationCurve"]

SMOOTH = 5


class SmoothedLoss:
    """Running 5-step median of the training loss, with its start and its lowest value."""

    def __init__(self) -> None:
        self._recent: collections.deque[float] = collections.deque(maxlen=SMOOTH)
        self.count = 0
        self.step = -1
        self.now: Optional[float] = None
        self.start: Optional[float] = None
        self.low: Optional[float] = None

    def add(self, rec: StepRecord) -> Optional[tuple[int, float, float, float]]:
        """Feed one record; returns (step, smoothed loss, start, low) when a new point became
        available, with the start and low as they stood *at that point*: a verdict on a point
        never sees the future."""
        if rec.meta.amp_skipped:
            return None
        loss = rec.loss
        if loss is None or not math.isfinite(loss):
            return None
        self._recent.append(loss)
        self.count += 1
        self.step = rec.step
        if len(self._recent) < SMOOTH:
            return None
        now = median(self._recent)
        self.now = now
        self.start = now if self.start is None else self.start
        self.low = now if self.low is None else min(self.low, now)
        return rec.step, now, self.start, self.low


class ValidationCurve:
    """Validation points, each with the mean training loss since the previous one."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.steps: collections.deque[int] = collections.deque(maxlen=maxlen)
        self.val: collections.deque[float] = collections.deque(maxlen=maxlen)
        self.train_sum: collections.deque[float] = collections.deque(maxlen=maxlen)
        self.train_count: collections.deque[int] = collections.deque(maxlen=maxlen)
        self._sum = 0.0
        self._count = 0

    def add(self, rec: StepRecord) -> None:
        if rec.meta.amp_skipped:
            return
        loss = rec.loss
        if loss is not None and math.isfinite(loss):
            self._sum += loss
            self._count += 1
        v = rec.validation
        if v is not None and math.isfinite(v):
            self.steps.append(rec.step)
            self.val.append(v)
            self.train_sum.append(self._sum)
            self.train_count.append(self._count)
            self._sum, self._count = 0.0, 0

    def train_mean(self, lo: int, hi: int) -> Optional[float]:
        """Mean training loss over the stretches ending at validation points lo..hi (inclusive)."""
        total = sum(list(self.train_sum)[lo : hi + 1])
        count = sum(list(self.train_count)[lo : hi + 1])
        return total / count if count else None
