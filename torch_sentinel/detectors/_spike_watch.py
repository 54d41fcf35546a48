"""Loss spikes seen on the host: a loss far above the robust baseline of the losses before it.

The robust z-score of a loss is ``(loss - median) / (1.4826 * MAD)`` over the previous
``window`` losses (median and median absolute deviation: a few earlier spikes in the window
move neither). The scale is floored at ``floor * |median|``, so a loss that barely moves (the
same batch every step) needs a rise of ``z * floor`` of its level before it counts. One spike
is reported per episode: the losses that follow above the threshold belong to it, until
``calm`` losses in a row are below it again.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Optional

import numpy as np

from ._robust import mad_sigma, median

__all__ = ["LossSpike", "RobustLossWatch"]


@dataclasses.dataclass(frozen=True)
class LossSpike:
    """One spike: the step whose loss crossed the threshold, and the baseline it crossed."""

    step: int
    loss: float
    z: float
    median: float
    scale: float
    baseline_steps: int


class RobustLossWatch:
    """Robust z of each training loss against the ones before it (host only, plain floats)."""

    def __init__(self, z: float = 6.0, window: int = 128, warmup: int = 64, floor: float = 0.01, calm: int = 5) -> None:
        self.z = z
        self.window = window
        self.warmup = warmup
        self.floor = floor
        self.calm = calm
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._in_episode = False
        self._calm_run = 0
        #: The robust z of the latest loss judged (nan before the warm-up ends).
        self.last_z = math.nan

    def add(self, step: int, loss: float) -> Optional[LossSpike]:
        """Judge ``loss`` (the training loss of ``step``) against the losses before it, then
        keep it for the next ones; non-finite losses are left to the ``non_finite`` checks."""
        if not math.isfinite(loss):
            return None
        spike = None
        if len(self._recent) >= self.warmup:
            history = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
            centre = median(history)
            mad = mad_sigma(history, centre)
            scale = max(mad, self.floor * abs(centre), 1e-12)
            z = (loss - centre) / scale
            self.last_z = z
            if z > self.z:
                if not self._in_episode:
                    spike = LossSpike(step, loss, z, centre, scale, len(history))
                self._in_episode = True
                self._calm_run = 0
            elif self._in_episode:
                self._calm_run += 1
                self._in_episode = self._calm_run < self.calm
        self._recent.append(loss)
        return spike
