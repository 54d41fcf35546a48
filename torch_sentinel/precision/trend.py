"""When will ``amax`` pass a format's limit? A log-linear fit over the recent samples.

Activations and gradients that grow do so by a factor per step (a learning rate too high for
the weights' scale, a residual stream adding up), so ``log2(amax)`` is fitted as a straight
line in the step number, by least squares over the last few sampled steps. The samples are not
evenly spaced (every step at first, then every tenth, then every fiftieth: ``cadence.py``);
least squares on the step numbers themselves handles that. No prediction is made (None) unless
the growth is real: enough samples over enough steps, a positive slope at least ``min_t``
standard errors above zero, so noise around a flat level predicts nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

__all__ = ["AmaxTrend", "Crossing", "Line", "fit_growth", "predict_crossing"]


@dataclasses.dataclass(frozen=True)
class Crossing:
    """Where the fitted line reaches the limit."""

    #: The (fractional) step.
    step: float
    #: Its standard error in steps, from the scatter of the samples around the line (delta
    #: method: the fitted value's error at that step over the slope). 0 for an exact line.
    error: float
    #: Steps from the first sample fitted to the last: how far the line was measured (a
    #: prediction far beyond it extrapolates a trend that may not last).
    span: int


@dataclasses.dataclass(frozen=True)
class Line:
    """A least-squares line through ``(step, log2 value)`` samples, and what its error needs."""

    slope: float
    intercept: float
    #: The samples' scatter around the line (0 for samples exactly on it).
    sigma: float
    n: int
    mean_step: float
    sxx: float
    span: int

    def crossing(self, log2_limit: float) -> Crossing:
        """Where the line reaches ``log2_limit`` (the slope is positive)."""
        at = (log2_limit - self.intercept) / self.slope
        error = self.sigma * math.sqrt(1.0 / self.n + (at - self.mean_step) ** 2 / self.sxx) / self.slope
        return Crossing(at, error, self.span)


def fit_growth(steps: Sequence[int], log2_values: Sequence[float], *, min_samples: int = 4, min_span: int = 5,
               min_t: float = 3.0) -> Optional[Line]:
    """The least-squares line through ``(step, log2 value)``, when it shows growth: enough
    samples over enough steps, and a slope at least ``min_t`` standard errors above zero;
    None otherwise.

    Args:
        steps: the sampled steps, increasing.
        log2_values: ``log2(amax)`` at those steps.
        min_samples: fewest samples to fit.
        min_span: fewest steps from the first sample to the last.
        min_t: the slope must be this many standard errors above zero.
    """
    n = len(steps)
    if n < max(min_samples, 3) or steps[-1] - steps[0] < min_span:
        return None
    xs = [float(s) for s in steps]
    mx = sum(xs) / n
    my = sum(log2_values) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, log2_values)) / sxx
    if slope <= 0:
        return None
    intercept = my - slope * mx
    ssr = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, log2_values))
    sigma = math.sqrt(ssr / (n - 2))
    if sigma > 0 and slope / (sigma / math.sqrt(sxx)) < min_t:
        return None
    return Line(slope, intercept, sigma, n, mx, sxx, int(steps[-1] - steps[0]))


def predict_crossing(steps: Sequence[int], log2_values: Sequence[float], log2_limit: float,
                     **growth: Any) -> Optional[Crossing]:
    """Where the growth line (:func:`fit_growth`, same keyword arguments) reaches
    ``log2_limit``; None when the series is not growing or is too short to tell."""
    line = fit_growth(steps, log2_values, **growth)
    return None if line is None else line.crossing(log2_limit)


class AmaxTrend:
    """The last ``window`` samples of one tensor's ``log2(amax)``.

    Args:
        window: samples kept.
    """

    def __init__(self, window: int = 8) -> None:
        self.samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)

    def add(self, step: int, amax: float) -> None:
        """Record ``amax`` at ``step`` (zero and non-finite values are not a level to fit)."""
        if amax > 0 and math.isfinite(amax):
            if self.samples and self.samples[-1][0] >= step:
                self.samples.clear()  # steps went back (a resumed run renumbered): start over
            self.samples.append((step, math.log2(amax)))

    def fit(self) -> Optional[Line]:
        """The growth line through the samples, or None (see :func:`fit_growth`)."""
        if not self.samples:
            return None
        return fit_growth([s for s, _ in self.samples], [v for _, v in self.samples])

    def crossing(self, limit: float) -> Optional[Crossing]:
        """Where ``amax`` is predicted to reach ``limit``, or None."""
        line = self.fit()
        return None if line is None else line.crossing(math.log2(limit))
