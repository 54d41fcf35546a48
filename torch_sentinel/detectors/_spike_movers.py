"""Who moved first before a loss spike: pure host functions over the window's numbers.

A :class:`SpikeWindow` holds the per-unit series of the steps around a spike (a unit is a
module, or a module's parameters in one optimizer param group when they are split across
groups). Each series is compared with its own baseline, the window's first steps: norms in log
space (they move by factors), logits as they are, with a floor on the baseline's spread
(``FLOOR``). A series *left its baseline* at the first step ``DEPART`` robust deviations above
it. The onset is walked back over a climb: the steps just before that were ``RISING``
deviations up and rising, when there are ``CLIMB`` or more of them (one for logits, whose fast
climbs cross the bar late: ``RISING_LOGIT``); one such step before a jump is noise. A departure
before the spike step counts only if the series stayed that far up until the spike: one that
came back was a blip, not what led to it. Steps a series did not measure (nan) are passed over.

A unit's lead is the spike step minus its earliest onset. Units are ranked by onset, then, within
a step, in the order a step computes (the forward's logits, the gradients, the update), then by
how far they went; ``Mover.score = lead + d / (d + DEPART)`` for a peak deviation ``d``: its
integer part is how early, its fraction how far.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional

import numpy as np

from ._robust import mad_sigma, median

__all__ = ["DEPART", "LOGITS", "RISING", "STATS", "Mover", "SpikeWindow", "baseline", "deviation_at", "movers",
           "per_unit", "transform"]

#: The per-unit series a window may hold (each ``[T, U]``, nan where a unit has none).
STATS = ("grad", "update", "weight", "exp_avg_sq", "attention_logit", "output_lse")

#: Series compared in log space (norms, sums of squares: they move by factors).
LOG_STATS = frozenset({"grad", "update", "weight", "exp_avg_sq"})
#: The smallest spread a baseline is given, per series (log units for norms: 0.2 is about 20%;
#: a fraction of the level for logits), so a baseline that happened to be flat over a few steps
#: does not make noise look like a departure. Set on the tuning split's clean runs: over windows
#: of 32 steps, the largest excursion of a healthy series past its first 8 steps stayed under 6
#: floors (gradients: 1.1 in log units at most; updates: 1.7, the embeddings' row-sparse ones;
#: the largest attention logit, a max over positions: 12 at a level of 9; the output
#: log-sum-exp: 1.6 at a level of 7).
FLOOR = {"grad": 0.2, "update": 0.3, "weight": 0.01, "exp_avg_sq": 0.2,
          "attention_logit": 0.25, "output_lse": 0.06}
#: Which series can reveal a first mover (weights are judged by the corruption rule: a healthy
#: weight norm drifts too smoothly for a baseline of a few steps to judge), with their order
#: inside one step: the forward's logits, then the gradients they make, then the update.
MOVERS = ("attention_logit", "output_lse", "grad", "update")
PHASE = {"attention_logit": 0, "output_lse": 0, "grad": 1, "update": 2}
LOGITS = frozenset({"attention_logit", "output_lse"})

DEPART = 6.0
RISING = 3.0
#: Logits (a max over positions, heavy-tailed) get a wide baseline floor; their climb is walked
#: back over steps one floor up and rising, however few.
RISING_LOGIT = 1.0
CLIMB = 2
BASELINE_MIN = 4
BASELINE_MAX = 8


@dataclasses.dataclass
class SpikeWindow:
    """The steps around one spike, as plain arrays.

    Attributes:
        steps: ``[T]`` consecutive step numbers, oldest first.
        spike_step: the step whose loss spiked (one of ``steps``).
        units: ``U`` unit names.
        stats: name (one of :data:`STATS`) -> ``[T, U]`` values, nan where unknown.
        lrs: learning-rate group key -> ``[T]`` values (nan where unknown).
        unit_lr: the ``lrs`` key of each unit's param group, or None.
        loss: ``[T]`` training losses.
        inputs: ``[T, 2]`` smallest and largest input value per step, or None.
    """

    steps: np.ndarray
    spike_step: int
    units: list[str]
    stats: dict[str, np.ndarray]
    lrs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    unit_lr: Sequence[Optional[str]] = ()
    loss: Optional[np.ndarray] = None
    inputs: Optional[np.ndarray] = None

    @property
    def spike_index(self) -> int:
        return int(np.searchsorted(self.steps, self.spike_step))

    def series(self, stat: str, unit: int) -> np.ndarray:
        values = self.stats.get(stat)
        if values is None:
            return np.full(len(self.steps), np.nan)
        return values[:, unit]


@dataclasses.dataclass(frozen=True)
class Mover:
    """A unit that left its baseline: where, by which series, how early and how far."""

    unit: str
    index: int
    stat: str
    onset: int
    lead_steps: int
    deviation: float

    @property
    def score(self) -> float:
        return self.lead_steps + self.deviation / (self.deviation + DEPART)


def per_unit(values: np.ndarray, unit_of: Sequence[int], units: int, how: str = "l2") -> np.ndarray:
    """Per-parameter figures ``[T, P]`` folded into units ``[T, U]``: ``"l2"`` norms combine as
    the root of the sum of squares, ``"sum"`` figures add; a unit with any nan parameter is nan.

    Args:
        values: ``[T, P]``.
        unit_of: the unit of each of the ``P`` columns.
        units: ``U``.
        how: ``"l2"`` or ``"sum"``.
    """
    t = values.shape[0]
    out = np.zeros((units, t))
    index = np.asarray(unit_of, dtype=np.int64)
    data = values.astype(np.float64) ** 2 if how == "l2" else values.astype(np.float64)
    np.add.at(out, index, data.T)
    out = out.T
    counts = np.bincount(index, minlength=units)
    out[:, counts[:units] == 0] = np.nan
    return np.sqrt(out) if how == "l2" else out


def departure(y: np.ndarray, stat: str, base: slice, last: int) -> Optional[tuple[int, float]]:
    """``(onset index, peak deviation)`` of the first departure of ``y`` above its baseline up to
    index ``last``, or None. Steps where ``y`` is nan (not measured: an optimizer step without a
    copy of the weights before it has no update norm, a forward that skipped the module no
    logit) are passed over: the walk-back and the stayed-up check go from one measured step to
    the next, so an onset is a measured step."""
    b = y[base]
    b = b[np.isfinite(b)]
    if len(b) < 2:
        return None
    med = median(b)
    spread = mad_sigma(b, med)
    floor = FLOOR[stat] if stat in LOG_STATS else FLOOR[stat] * max(abs(med), 1.0)
    z = (y - med) / max(spread, floor)
    if stat == "output_lse":
        z = np.abs(z)  # the normaliser drifts either way
    seen = np.flatnonzero(np.isfinite(z[: last + 1]))
    seen = seen[seen >= base.stop]  # the measured steps after the baseline; positions below index them
    zs, ys = z[seen], y[seen]
    above = np.flatnonzero(zs >= DEPART)
    if not len(above):
        return None
    hit = onset = int(above[0])
    rising = RISING_LOGIT if stat in LOGITS else RISING
    while onset >= 1 and zs[onset - 1] >= rising and ys[onset - 1] < ys[onset]:
        onset -= 1
    if hit - onset < (1 if stat in LOGITS else CLIMB):
        onset = hit  # one step above the bar before a jump is noise, not a climb
    if not bool(np.all(zs[onset:] >= rising)):
        return None  # it came back before the spike: a blip, not what led to it
    return int(seen[onset]), float(np.nanmax(z[seen[onset] : last + 1]))  # an infinite figure counts


def transform(x: np.ndarray, stat: str) -> np.ndarray:
    if stat not in LOG_STATS:
        return x.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), np.where(x == 0, -50.0, np.nan))


def baseline(window: SpikeWindow) -> slice:
    pre = window.spike_index
    n = max(BASELINE_MIN, min(BASELINE_MAX, pre // 2))
    return slice(0, min(n, max(pre - 1, 0)))


def movers(window: SpikeWindow) -> list[Mover]:
    """Every unit that left its baseline before or at the spike, ranked (first mover first)."""
    spike = window.spike_index
    base = baseline(window)
    out = []
    for u, name in enumerate(window.units):
        best: Optional[Mover] = None
        for stat in MOVERS:
            y = transform(window.series(stat, u), stat)
            found = departure(y, stat, base, spike)
            if found is None:
                continue
            onset, deviation = found
            m = Mover(name, u, stat, onset, window.spike_step - int(window.steps[onset]), deviation)
            if best is None or _order(m) < _order(best):
                best = m
        if best is not None:
            out.append(best)
    out.sort(key=_order)
    return out


def _order(m: Mover) -> tuple[int, int, float]:
    return (m.onset, PHASE.get(m.stat, 3), -m.deviation)


def deviation_at(window: SpikeWindow, stat: str, unit: int, t: int) -> float:
    y = transform(window.series(stat, unit), stat)
    b = y[baseline(window)]
    b = b[np.isfinite(b)]
    if len(b) < 2 or not np.isfinite(y[t]):
        return math.nan
    med = median(b)
    spread = max(mad_sigma(b, med), FLOOR[stat])
    return float((y[t] - med) / spread)
