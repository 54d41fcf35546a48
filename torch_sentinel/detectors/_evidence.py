"""The loss history as evidence: what a dynamics verdict must be consistent with.

A dynamics finding (``update_ratio``, ``vanishing_gradient``, ``exploding_gradient``,
``diverging``, ``plateau``) states a claim about training: "the learning rate is too high", "the
early layers barely learn", "learning has stalled". The training loss is the one figure every
such claim predicts something about, so each is checked against it before it is given as a
warning: a claim the loss history does not support is given as ``severity="info"``, with what
the history showed instead.

The statistics compare like with like and measure the loss against itself:

- **noise band**: the per-step noise of the loss, estimated robustly from the loss itself: the
  median absolute deviation of its first differences (a steady trend is a constant difference
  and drops out), scaled to a standard deviation (x1.4826) and divided by sqrt(2) (a difference
  of two noisy values has twice the variance). Batch-to-batch noise of an RL surrogate, a robust
  loss or a contrastive loss sets its own band;
- **equal windows**: a change is the difference of the medians of two windows of the same size
  (never one batch against a median), in units of the standard error of that difference
  (a median of ``n`` noisy values has standard error ~1.2533 sigma / sqrt(n));
- **improving fast**: the loss fell by half of its starting level (for a positive loss) or by
  ``FAST_Z`` standard errors (a loss that can be negative has no scale of its own);
- **unstable**: a window rose above the lowest earlier window by ``RISE_Z`` standard errors and
  by ``RISE_FRACTION`` of its magnitude, or the loss became non-finite;
- **slow progress**: over a span, the last window is not significantly below the first.

Memory is bounded: the last ``maxlen`` (256) losses, plus the first loss of the run.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Literal, Optional

import numpy as np

from .._record import StepRecord
from ._robust import mad_sigma, median

__all__ = ["FAST_Z", "RISE_Z", "SLOW_Z", "LossHistory", "Support", "noise_band", "standard_errors"]

#: A rise of a window median above the lowest earlier one, in standard errors of the difference,
#: that batch noise does not produce (also read as "beyond the noise band").
RISE_Z = 4.0
#: ... and by this fraction of the loss's magnitude (a loss at float32's floor is all noise).
RISE_FRACTION = 0.1
#: A positive loss at twice its earlier level has risen, whatever its noise (``diverging``'s factor).
DOUBLE = 2.0
#: A fall, in standard errors, that counts as fast for a loss without a scale of its own.
FAST_Z = 8.0
#: A fall smaller than this many standard errors is not progress.
SLOW_Z = 3.0
#: Standard error of a median of n normal values: ~1.2533 sigma / sqrt(n).
_MEDIAN_SE = 1.2533

Verdict = Literal["supported", "contradicted", "unsupported", "undecided"]


@dataclasses.dataclass(frozen=True)
class Support:
    """Whether the loss history supports a claim: ``supported`` (give it as a warning),
    ``contradicted`` or ``unsupported`` (give it as info, saying why), or ``undecided`` (too few
    losses yet: wait)."""

    verdict: Verdict
    #: One sentence: what the loss history showed.
    reason: str
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def warns(self) -> bool:
        return self.verdict == "supported"

    @property
    def decided(self) -> bool:
        return self.verdict != "undecided"

    def evidence(self) -> dict[str, Any]:
        """The figures for a finding's evidence."""
        return {"loss_history": self.verdict, "loss_history_says": self.reason, **self.figures}


@dataclasses.dataclass(frozen=True)
class Change:
    """Two equal windows of the loss compared: medians, their steps, and the change in standard
    errors (negative: the loss fell)."""

    before: float
    after: float
    steps_before: tuple[int, int]
    steps_after: tuple[int, int]
    z: float
    #: The standard error of the difference (the loss's own noise, for windows of this size).
    se: float = math.nan

    @property
    def ratio(self) -> float:
        """after / before for a positive loss (nan otherwise)."""
        return self.after / self.before if self.before > 0 and self.after >= 0 else math.nan

    def describe(self) -> str:
        return (f"{self.before:.4g} (median of steps {self.steps_before[0]}-{self.steps_before[1]}) to "
                f"{self.after:.4g} (steps {self.steps_after[0]}-{self.steps_after[1]})")


def noise_band(values: np.ndarray) -> float:
    """The per-step noise of a series, from the median absolute deviation of its first
    differences (nan with fewer than 4 values)."""
    if len(values) < 4:
        return math.nan
    d = np.diff(values)
    return mad_sigma(d, median(d)) / math.sqrt(2.0)


class LossHistory:
    """The training loss of recent steps (finite values, AMP-skipped steps left out), and the
    statistics the dynamics verdicts read."""

    #: span() and noise() results since the last loss, by (what, since, until): a verdict asks
    #: for the same span several times (plateau: three spans and two noise bands every fifth
    #: loss). Derived, so never saved (``*_cache``, see ``_plain.py``); None until asked for.
    _memo_cache: Optional[dict[tuple[str, Optional[int], Optional[int]], Any]] = None

    def __init__(self, maxlen: int = 256) -> None:
        self._steps: collections.deque[int] = collections.deque(maxlen=maxlen)
        self._values: collections.deque[float] = collections.deque(maxlen=maxlen)
        self.count = 0
        #: (step, loss) of the first finite loss of the run.
        self.first: Optional[tuple[int, float]] = None
        #: The first step whose loss was NaN/Inf.
        self.nonfinite_at: Optional[int] = None

    def add(self, record: StepRecord) -> None:
        if record.meta.amp_skipped:
            return
        loss = record.loss
        if loss is None:
            return
        if not math.isfinite(loss):
            if self.nonfinite_at is None:
                self.nonfinite_at = record.step
            return
        self._steps.append(record.step)
        self._values.append(loss)
        self._memo_cache = None
        self.count += 1
        if self.first is None:
            self.first = (record.step, loss)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def last_step(self) -> Optional[int]:
        return self._steps[-1] if self._steps else None

    def span(self, since: Optional[int] = None, until: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, losses) with ``since <= step <= until`` (read-only arrays, shared by the
        callers until the next loss is added)."""
        key = ("span", since, until)
        memo = self._memos()
        got = memo.get(key)
        if got is None:
            got = memo[key] = self._span(since, until)
        return got

    def _span(self, since: Optional[int], until: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
        steps = np.fromiter(self._steps, dtype=np.int64, count=len(self._steps))
        values = np.fromiter(self._values, dtype=np.float64, count=len(self._values))
        keep = np.ones(len(steps), dtype=bool)
        if since is not None:
            keep &= steps >= since
        if until is not None:
            keep &= steps <= until
        steps, values = steps[keep], values[keep]
        steps.flags.writeable = values.flags.writeable = False
        return steps, values

    def noise(self, since: Optional[int] = None, until: Optional[int] = None) -> float:
        key = ("noise", since, until)
        memo = self._memos()
        got = memo.get(key)
        if got is None:
            got = memo[key] = noise_band(self.span(since, until)[1])
        return got

    def _memos(self) -> dict[tuple[str, Optional[int], Optional[int]], Any]:
        memo = self._memo_cache
        if memo is None:
            memo = self._memo_cache = {}
        return memo

    @staticmethod
    def window(n: int) -> int:
        """The window size for a span of ``n`` losses: a quarter of it, 3 to 10 values."""
        return max(3, min(10, n // 4))

    def change(self, since: Optional[int] = None, until: Optional[int] = None,
               sigma: Optional[float] = None) -> Optional[Change]:
        """The first and the last equal windows of the span compared (None: fewer than two
        windows). ``sigma`` defaults to the span's own noise band."""
        steps, values = self.span(since, until)
        w = self.window(len(values))
        if len(values) < 2 * w:
            return None
        s = self.noise(since, until) if sigma is None else sigma
        a, b = median(values[:w]), median(values[-w:])
        return Change(a, b, (int(steps[0]), int(steps[w - 1])), (int(steps[-w]), int(steps[-1])),
                      standard_errors(b - a, s, w), _MEDIAN_SE * s * math.sqrt(2.0 / w))

    def change_from(self, head: list[tuple[int, float]], since: Optional[int] = None) -> Optional[Change]:
        """Like :meth:`change`, with the first window taken from ``head`` (the first losses of
        the span, kept by the caller after this history forgot them): equal windows of
        ``len(head)`` values, in the span's own noise."""
        steps, values = self.span(since)
        w = len(head)
        if w < 3 or len(values) < w:
            return None
        a, b = median([v for _, v in head]), median(values[-w:])
        s = self.noise(since)
        return Change(a, b, (head[0][0], head[-1][0]), (int(steps[-w]), int(steps[-1])),
                      standard_errors(b - a, s, w), _MEDIAN_SE * s * math.sqrt(2.0 / w))

    def rise(self, since: Optional[int] = None) -> Optional[Change]:
        """The largest rise of a window (consecutive, equal windows from ``since``) above the
        lowest loss level before it, if it is beyond the noise band (``RISE_Z`` standard errors
        and ``RISE_FRACTION`` of the loss's magnitude) or, for a positive loss, a doubling. The
        levels before a window are the earlier windows and the run's first loss when it was
        taken at or before ``since`` (a step's loss comes before its update: a jump at the first
        step is a rise)."""
        steps, values = self.span(since)
        w = self.window(len(values))
        if len(values) < 2 * w:
            return None
        s = self.noise(since)
        k = len(values) // w
        levels = [(median(values[i * w:(i + 1) * w]), w, int(steps[i * w]), int(steps[i * w + w - 1]))
                  for i in range(k)]
        first = self.first
        if first is not None and since is not None and first[0] <= since:
            levels.insert(0, (first[1], 1, first[0], first[0]))
        best: Optional[Change] = None
        low = 0
        for i in range(1, len(levels)):
            if levels[i - 1][0] < levels[low][0]:
                low = i - 1
            ref, now = levels[low], levels[i]
            up = now[0] - ref[0]
            z = standard_errors(up, s, ref[1], now[1])
            scale = max(abs(ref[0]), abs(now[0]))
            doubled = ref[0] > 0 and now[0] >= DOUBLE * ref[0]
            if ((z >= RISE_Z and up > RISE_FRACTION * scale) or doubled) and (best is None or up > best.after - best.before):
                best = Change(ref[0], now[0], (ref[2], ref[3]), (now[2], now[3]), z)
        return best

    # -- claims ---------------------------------------------------------------------------
    def improving_fast(self, change: Optional[Change]) -> bool:
        if change is None:
            return False
        if change.before > 0 and change.after >= 0:
            return change.after <= 0.5 * change.before and change.z <= -SLOW_Z
        return change.z <= -FAST_Z

    def too_high(self, onset: int, min_points: int = 10) -> Support:
        """Support for "the learning rate is too high" from step ``onset`` on: the loss became
        non-finite or rose beyond its noise band; a fast-improving loss contradicts it."""
        if self.nonfinite_at is not None and self.nonfinite_at >= onset:
            return Support("supported", f"the loss became non-finite at step {self.nonfinite_at}",
                           {"loss_nonfinite_at": self.nonfinite_at})
        up = self.rise(onset)
        if up is not None:
            return Support("supported", f"the loss rose from {up.describe()}, {up.z:.3g} standard errors "
                                        "above its own noise band", _figures(up, "loss_rise"))
        # A fall measured from the first loss the claim may speak for (the one before onset too).
        first = self.first[0] if self.first is not None else onset
        fell = self.change(min(onset, first))
        if self.improving_fast(fell):
            assert fell is not None
            return Support("contradicted", f"the loss improved fast, from {fell.describe()}, and never rose "
                                           "beyond its noise band", _figures(fell, "loss_change"))
        n = len(self.span(onset)[1])
        if n < min_points:
            return Support("undecided", f"{n} losses since step {onset}")
        return Support("unsupported", f"the loss neither rose beyond its noise band nor became non-finite "
                                      f"over the {n} steps since step {onset}",
                       _figures(fell, "loss_change") if fell is not None else {})

    def too_low(self, onset: int, lr_fell: Optional[float] = None, min_points: int = 10) -> Support:
        """Support for "the learning rate is too low" over the steps since ``onset``: slow
        progress there. A loss that fell by 10x or more over the run has converged (small
        updates of a fit that is done), unless the learning rate itself collapsed
        (``lr_fell``: how far below its peak it is) while the loss stalled."""
        recent = self.change(onset)
        if recent is None or len(self.span(onset)[1]) < min_points:
            return Support("undecided", "too few losses since the low ratios began")
        if recent.z <= -SLOW_Z:
            return Support("contradicted", f"the loss is still falling, from {recent.describe()} "
                                           f"({-recent.z:.3g} standard errors)", _figures(recent, "loss_change"))
        stalled = f"the loss stalled since step {onset}: {recent.describe()}"
        if lr_fell is not None and lr_fell >= 1e3:
            return Support("supported", f"{stalled}, while the learning rate fell {lr_fell:.3g}x below its peak",
                           {**_figures(recent, "loss_change"), "lr_fell": lr_fell})
        first = self.first  # the loss before any update: kept for good, the history is bounded
        if first is not None and first[1] > 0 and 0 <= recent.after <= 0.1 * first[1]:
            return Support("contradicted", f"the loss fell {first[1] / max(recent.after, 1e-300):.3g}x over the "
                                           f"run ({first[1]:.4g} at step {first[0]} to {recent.describe()}): a fit "
                                           "that has converged, whose updates are small because its gradients are",
                           {**_figures(recent, "loss_change"), "first_loss": first[1]})
        return Support("supported", stalled, _figures(recent, "loss_change"))

    def not_improving_fast(self, since: Optional[int] = None) -> Support:
        """Support for a claim that training is harmed (gradients vanish or explode): a loss
        improving fast over the span contradicts it."""
        fell = self.change(since)
        if fell is None:
            return Support("undecided", "too few losses")
        if self.improving_fast(fell):
            return Support("contradicted", f"the loss improved fast, from {fell.describe()}",
                           _figures(fell, "loss_change"))
        return Support("supported", f"the loss went from {fell.describe()}", _figures(fell, "loss_change"))


def standard_errors(diff: float, sigma: float, w: int, w_after: Optional[int] = None) -> float:
    """``diff`` in standard errors of a difference of two medians of ``w`` and ``w_after``
    (default ``w``) values."""
    se = _MEDIAN_SE * sigma * math.sqrt(1.0 / w + 1.0 / (w_after or w))
    if not math.isfinite(se):
        return 0.0
    if se <= 0:
        return math.copysign(math.inf, diff) if diff else 0.0
    return diff / se


def _figures(change: Change, name: str) -> dict[str, Any]:
    return {name: {"from": change.before, "to": change.after, "steps_from": list(change.steps_before),
                   "steps_to": list(change.steps_after), "standard_errors": change.z}}
