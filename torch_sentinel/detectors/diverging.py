"""``diverging``: the training loss climbs instead of falling, before any NaN.

Every verdict uses only the past, and compares like with like: the loss is cut into consecutive
windows of ``SMOOTH`` = 5 steps and each window's median is compared with the lowest *window
median* before it (never with the single lowest batch), in units of the loss's own noise band
(``_evidence.py``: the median absolute deviation of its first differences).

Two shapes of divergence:
- a climb: a window sits at least ``diverging.factor`` = 2 times above the lowest earlier window
  and beyond the noise band (``RISE_Z`` standard errors), the next window stays at the factor,
  and both are above the first window
  (a run that learned and then spiked briefly back below its starting point is noisy, not
  diverging). A loss that is not positive (a policy-gradient surrogate that changes sign, a
  negative log-likelihood of a density) has no scale for a factor: there the climb must be
  ``2 * RISE_Z`` standard errors;
- a jump from the first step that never comes back (an oversized learning rate): the first
  update already threw the loss up, so no window is above the first one. The reference is the
  loss of step 0, the only one taken before any update: every loss since step 1 stayed at least
  ``diverging.factor`` times above it (the *smallest* of them, so one noisy first batch cannot
  raise the alarm on a run that learns).

A climbing loss is a symptom; the claim the finding makes (``next_check`` "lower the learning
rate": the optimization is unstable) needs the detector's update-side figures to agree. An
unstable optimizer shows it in the updates: an update/weight ratio above
``diverging.unstable_ratio`` (0.1, ``update_ratio``'s bound) on a sampled step since shortly
before the climb began, a gradient norm grown ``_GRAD_GROWTH`` times over the climb (not at lr
0), or a loss that went non-finite. Without one of those the loss climbed for
another reason (a value loss whose targets grow as a policy improves, a robust loss whose batch
value depends on how many outliers the batch holds) and the finding is ``info``, with the
figures that contradict instability.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Optional

import numpy as np

from .._collect.probes.norms import GradNorms, WeightNorms
from .._collect.probes.updates import UpdateNorms
from .._findings import Finding
from .._record import StepRecord
from ._curve import SMOOTH
from ._evidence import RISE_Z, LossHistory, standard_errors
from ._robust import median
from .base import Detector, Threshold

__all__ = ["DivergingDetector"]

_HOLD = 2
#: The gradient norm over the climb this many times its level before it: an unstable optimizer.
_GRAD_GROWTH = 10.0


class DivergingDetector(Detector):
    kind = "diverging"
    rung = "curves"
    next_check = "lower_learning_rate"
    hypothesis = "the optimization is unstable"
    reads = (GradNorms, UpdateNorms, WeightNorms)
    thresholds = {
        "factor": Threshold(2.0, "a doubling of the loss's window median over its lowest window: no "
                                 "healthy curve doubles, held two windows"),
        "unstable_ratio": Threshold(0.1, "update_ratio.high: an update/weight ratio above it is an "
                                         "unstable optimizer (DeepDiagnosis)"),
    }

    def setup(self) -> None:
        self.factor = self.threshold("factor")
        self.unstable_ratio = self.threshold("unstable_ratio")
        self.loss = LossHistory()
        self._window: list[tuple[int, float]] = []
        self._recent: collections.deque[float] = collections.deque(maxlen=SMOOTH)
        #: (first step, last step, median) of the first complete window, and of the lowest so far
        self._start: Optional[tuple[int, int, float]] = None
        self._lowest: Optional[tuple[int, int, float]] = None
        self._run: list[tuple[int, int, float]] = []
        self._reported = False
        # the pre-update reference: the first loss, and the smallest loss seen after it
        self._first: Optional[tuple[int, float]] = None
        self._after_min = math.inf
        self._after_count = 0
        #: (step, global update/weight ratio) of sampled steps, and (step, total gradient norm)
        self._ratios: collections.deque[tuple[int, float]] = collections.deque(maxlen=64)
        #: The latest learning rate (at 0 no gradient makes the optimizer unstable).
        self._lr: Optional[float] = None
        self._grads: collections.deque[tuple[int, float]] = collections.deque(maxlen=256)

    def update(self, record: StepRecord) -> None:
        if self._reported or self.ctx.adversarial():
            return  # an adversarial loss (a GAN's) oscillates by design (core scoping)
        self.loss.add(record)
        self._track_updates(record)
        self._track_first(record)
        loss = record.loss
        if record.meta.amp_skipped or loss is None or not math.isfinite(loss):
            return
        self._window.append((record.step, loss))
        self._recent.append(loss)
        found = None
        if len(self._window) == SMOOTH:
            window, self._window = self._window, []
            found = self._judge((window[0][0], window[-1][0], median([v for _, v in window])))
        if found is None:
            found = self._jump_finding(record.step)
        if found is not None:
            self._reported = True
            self.flag(found)

    def _track_updates(self, rec: StepRecord) -> None:
        lrs = [lr for lr in rec.meta.lrs if lr is not None]
        if lrs:
            self._lr = max(lrs)
        grads = rec.fact(GradNorms)
        if grads is not None and math.isfinite(grads.total):
            self._grads.append((rec.step, grads.total))
        updates, weights = rec.fact(UpdateNorms), rec.fact(WeightNorms)
        if updates is not None and weights is not None:
            u, w = updates.values, weights.values
            denom = float((w**2).sum())
            if denom > 0 and np.isfinite(u).all() and np.isfinite(w).all():
                self._ratios.append((rec.step, math.sqrt(float((u**2).sum()) / denom)))

    def _track_first(self, rec: StepRecord) -> None:
        loss = rec.loss
        if rec.meta.amp_skipped or loss is None or not math.isfinite(loss):
            return
        if self._first is None:
            self._first = (rec.step, loss)
        else:
            self._after_min = min(self._after_min, loss)
            self._after_count += 1

    def _judge(self, now: tuple[int, int, float]) -> Optional[Finding]:
        start = self._start if self._start is not None else now
        self._start = start
        low = self._lowest
        if low is None or now[2] < low[2]:
            self._lowest = now
        if low is not None and self._climbed(low, now, start, confirming=bool(self._run)):
            self._run.append(now)
        else:
            self._run = []
        if low is not None and len(self._run) >= _HOLD:
            return self._climb_finding(low, start)
        return None

    def _climbed(self, low: tuple[int, int, float], now: tuple[int, int, float], start: tuple[int, int, float],
                 confirming: bool) -> bool:
        """The first window of a climb must be beyond the noise band; the next one confirms it
        by staying at the factor (or, for a loss that is not positive, above the start)."""
        if now[2] <= start[2]:
            return False
        if confirming:
            return now[2] >= self.factor * low[2] if low[2] > 0 else True
        z = standard_errors(now[2] - low[2], self.loss.noise(), SMOOTH)
        if low[2] > 0:
            return now[2] >= self.factor * low[2] and z >= RISE_Z
        return z >= 2 * RISE_Z

    def _climb_finding(self, low: tuple[int, int, float], start: tuple[int, int, float]) -> Finding:
        first, last = self._run[0], self._run[-1]
        sigma = self.loss.noise()
        z = standard_errors(last[2] - low[2], sigma, SMOOTH)
        support, figures = self._unstable(low[0], first[0])
        factor = f"{last[2] / low[2]:.3g}x " if low[2] > 0 else ""
        message = (f"the training loss climbed to {last[2]:.4g} (median of steps {last[0]}-{last[1]}), "
                   f"{factor}its lowest window median {low[2]:.4g} (steps {low[0]}-{low[1]}) and {z:.3g} "
                   f"standard errors above it (noise band {sigma:.3g} per step); it started at {start[2]:.4g}")
        return self._finding(message, support, figures, step=last[1], onset=first[0],
                             evidence={"start_loss": start[2], "lowest_loss": low[2], "lowest_steps": [low[0], low[1]],
                                       "loss_at_detection": last[2], "factor": last[2] / low[2] if low[2] > 0 else None,
                                       "standard_errors": z, "noise_band": sigma, "steps_observed": self.loss.count})

    def _jump_finding(self, step: int) -> Optional[Finding]:
        first = self._first
        if first is None or first[1] <= 0 or self._after_count < SMOOTH + 2:
            return None
        if self._after_min < self.factor * first[1]:
            return None
        now = median(self._recent)
        support, figures = self._unstable(first[0], first[0] + 1)
        message = (f"the training loss jumped after the first update and never came back: step "
                   f"{first[0]} (before any update) had {first[1]:.4g}, every loss of the "
                   f"{self._after_count} steps since was at least {self._after_min:.4g} "
                   f"({self._after_min / first[1]:.3g}x); median of the last {len(self._recent)} {now:.4g}")
        return self._finding(message, support, figures, step=step, onset=first[0] + 1,
                             evidence={"first_loss": first[1], "first_step": first[0],
                                       "lowest_loss_since": self._after_min, "loss_at_detection": now,
                                       "factor": self._after_min / first[1], "steps_observed": self.loss.count})

    def _unstable(self, before: int, onset: int) -> tuple[Optional[str], dict[str, Any]]:
        """What in the update-side figures says the optimization is unstable around the climb
        (None: nothing), and the figures read."""
        figures: dict[str, Any] = {}
        if self.loss.nonfinite_at is not None:
            return f"the loss became non-finite at step {self.loss.nonfinite_at}", figures
        ratios = [(s, r) for s, r in self._ratios if s >= before - 2 * SMOOTH]
        if ratios:
            worst = max(ratios, key=lambda x: x[1])
            figures["update_ratio_max"] = {"step": worst[0], "ratio": worst[1]}
            if worst[1] > self.unstable_ratio:
                return (f"the update/weight ratio at step {worst[0]} was {worst[1]:.3g}, above "
                        f"{self.unstable_ratio:g}"), figures
        # like with like: as many steps before the climb as during it, and the whole
        # distribution must move (median and 90th percentile): a policy-gradient loop's gradient
        # norms come in bursts, and a median over a stretch that happens to hold more of them
        # is not growth
        during = [g for s, g in self._grads if s >= onset]
        ahead = [g for s, g in self._grads if s < onset][-max(len(during), SMOOTH):]
        if len(ahead) >= SMOOTH and len(during) >= SMOOTH and self._lr != 0:
            growth = min(float(np.quantile(during, q)) / max(float(np.quantile(ahead, q)), 1e-30) for q in (0.5, 0.9))
            a, b = median(ahead), median(during)
            figures["grad_norm"] = {"before": a, "during": b, "growth": growth}
            if growth >= _GRAD_GROWTH:
                return f"the gradient norm grew {growth:.3g}x ({a:.3g} to {b:.3g}, median and 90th percentile)", figures
        return None, figures

    def _finding(self, message: str, support: Optional[str], figures: dict[str, Any], step: int, onset: int,
                 evidence: dict[str, Any]) -> Finding:
        if support is not None:
            text = f"{message}; the optimization is unstable: {support}"
            severity = "error"
        else:
            parts = []
            if "update_ratio_max" in figures:
                parts.append(f"the update/weight ratio stayed at or below {figures['update_ratio_max']['ratio']:.3g}")
            if "grad_norm" in figures:
                g = figures["grad_norm"]
                parts.append(f"the gradient norm went from {g['before']:.3g} to {g['during']:.3g}")
            said = "; ".join(parts) or "no update-side figure grew"
            text = (f"{message}; but the updates stayed in scale ({said}), so this is not an unstable "
                    "optimizer: the loss measures something that changes as training goes (a value "
                    "loss whose targets grow as a policy improves, a batch loss that depends on how "
                    "many outliers the batch holds, heavy-tailed inputs)")
            severity = "info"
        fields: dict[str, Any] = {}
        if support is None:
            fields["next_check"] = "continue_training_or_collect_more_evidence"
        return self.finding(text, step=step, onset_step=onset, severity=severity,
                            evidence={**evidence, **figures, "unstable": support}, **fields)
