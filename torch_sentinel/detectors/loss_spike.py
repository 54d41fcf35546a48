"""``loss_spike``: a step's training loss far above its recent robust baseline, with who moved
first and why.

Detection reads the losses the step records already carry to the host (no added read): robust
z = (loss - median) / (1.4826 * MAD) of the previous ``loss_spike.window`` = 128 losses, above
``loss_spike.z`` = 6, after ``loss_spike.warmup`` = 64 losses (OLMo-core's window and warm-up;
median and MAD in place of its mean and standard deviation, so earlier spikes in the window move
neither). One finding per spike episode.

Forensics: at a spike, the spike ring (``_collect/spike_ring.py``, the last 32 steps of every
parameter's update, weight and Adam-state norms, on the device) is read once: a cold-path copy,
at most one per flush, only on flushes that found a spike. With the gradient norms, learning
rates, attention logits and output log-sum-exp that the records carried, it makes a
``SpikeWindow``; ``_spike_forensics.attribute`` names the first mover and the cause. The spike
is seen at the flush after it (``flush_every`` = 10 steps later at most): the ring then still
holds at least 21 steps before it; with ``flush_every`` above 24 the look-back shrinks and
``evidence["look_back"]`` says how far it reached.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np

from .._collect.probe import Probe
from .._collect.probes.data import InputRange
from .._collect.probes.norms import GradNorms
from .._collect.probes.spikes import SpikeForward, SpikeProbe
from .._collect.spike_ring import RING_STATS, RingLayout
from .._findings import Finding
from .._record import StepRecord
from ._spike_forensics import SpikeVerdict, SpikeWindow, attribute, per_unit
from ._spike_watch import LossSpike, RobustLossWatch
from .base import Detector, Threshold

__all__ = ["RING_STEPS", "LossSpikeDetector"]

#: Steps the device ring holds.
RING_STEPS = 32
#: Movers whose series go into the finding (and TensorBoard).
TOP = 3

NEXT_CHECKS = {
    "learning_rate": "inspect_learning_rate_schedule",
    "bad_batch": "inspect_the_batch_at_the_spike",
    "adam_second_moment": "raise_adam_eps_or_lower_beta2",
    "attention_logits": "add_qk_layernorm_or_lower_learning_rate",
    "output_logits": "add_z_loss",
    "corrupted_weight": "check_hardware_and_restore_checkpoint",
}


@dataclasses.dataclass(frozen=True)
class _Step:
    """What the host keeps of one step for the forensics (plain numbers)."""

    step: int
    loss: float
    grads: np.ndarray
    lrs: dict[str, float]
    attention: np.ndarray
    lse: float
    inputs: tuple[float, float]


class LossSpikeDetector(Detector):
    kind = "loss_spike"
    rung = "curves"
    next_check = "inspect_the_first_mover"
    hypothesis = "one module left its recent behaviour before the loss jumped; the evidence names how"
    reads = (GradNorms, SpikeForward, InputRange)
    thresholds = {
        "z": Threshold(6.0, "OLMo-core skips a step at 6 sigma above the mean of the last 128 losses; "
                            "here 6 robust deviations (1.4826 MAD) above their median"),
        "window": Threshold(128, "OLMo-core's rolling window of losses"),
        "warmup": Threshold(64, "OLMo-core judges once half its window (64 losses) is held"),
    }
    #: The probe and its ring are the live run's (attach() rebuilds them).
    live_attributes = frozenset({"probe"})

    def __init__(self) -> None:
        self.probe = SpikeProbe(RING_STEPS)

    def setup(self) -> None:
        self.watch = RobustLossWatch(self.threshold("z"), int(self.threshold("window")), int(self.threshold("warmup")))
        self.spikes = 0
        self._history: collections.deque[_Step] = collections.deque(maxlen=2 * RING_STEPS)
        self._pending: list[LossSpike] = []
        self._columns_cache: Optional[tuple[Sequence[str], np.ndarray, dict[str, int]]] = None

    def probes(self) -> Sequence[Probe]:
        return (self.probe,)

    def statistics(self) -> dict[str, float]:
        stats = {"spikes": float(self.spikes)}
        if math.isfinite(self.watch.last_z):
            stats["z"] = self.watch.last_z  # the latest loss's robust z (after the warm-up)
        return stats

    def update(self, record: StepRecord) -> None:
        if self.ctx.adversarial():
            return  # an adversarial loss (a GAN's) oscillates by design (core scoping)
        loss = record.loss
        if record.meta.amp_skipped or loss is None or record.meta.backward_calls == 0:
            return
        self._keep(record, loss)
        spike = self.watch.add(record.step, loss)
        if spike is not None:
            self._pending.append(spike)
            self.spikes += 1

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        pending, self._pending = self._pending, []
        if not pending:
            return []
        ring = self.probe.ring.read() if self.probe.ring is not None else None  # cold path, once
        return [self._finding(spike, self._verdict(spike, ring)) for spike in pending]

    # -- host history ---------------------------------------------------------------------
    def _keep(self, rec: StepRecord, loss: float) -> None:
        grads = self._grads_in_ring_order(rec)
        lrs = {n: (lr if lr is not None else math.nan) for n, lr in zip(rec.meta.lr_names, rec.meta.lrs)}
        fwd = rec.fact(SpikeForward)
        attention = fwd.attention if fwd is not None else np.zeros(0)
        lse = fwd.output_lse if fwd is not None else math.nan
        inputs = (math.nan, fwd.ids_max if fwd is not None else math.nan)
        if math.isnan(inputs[1]):
            data = rec.fact(InputRange)
            if data is not None:
                inputs = (float(data.inputs[0]), float(data.inputs[1]))
        self._history.append(_Step(rec.step, loss, grads, lrs, attention, lse, inputs))

    def _grads_in_ring_order(self, rec: StepRecord) -> np.ndarray:
        layout = self.probe.layout
        norms = rec.fact(GradNorms)
        if layout is None or norms is None:
            return np.zeros(0)
        cached = self._columns_cache
        if cached is None or (cached[0] is not norms.names and list(cached[0]) != list(norms.names)):
            pos = {k: i for i, k in enumerate(norms.names)}
            index = np.array([pos.get(p, -1) for p in layout.params], dtype=np.int64)
            cached = self._columns_cache = (norms.names, index, {p: i for i, p in enumerate(layout.params)})
        _, index, column = cached
        out = np.where(index >= 0, norms.values[np.maximum(index, 0)], np.nan)
        missing = [column[n] for n in norms.missing if n in column]
        out[missing] = np.nan
        return out

    # -- forensics ------------------------------------------------------------------------
    def _verdict(self, spike: LossSpike, ring: Optional[tuple[np.ndarray, dict[int, np.ndarray]]]) -> Optional[SpikeVerdict]:
        layout = self.probe.layout
        if layout is None or ring is None:
            return None
        window = self._window(spike.step, layout, ring)
        if window is None:
            return None
        return attribute(window)

    def _window(self, spike_step: int, layout: RingLayout, ring: tuple[np.ndarray, dict[int, np.ndarray]]) -> Optional[SpikeWindow]:
        values, row_steps = ring
        k = values.shape[0]
        held = {int(s) for rows in row_steps.values() for s in rows if s >= 0}
        steps = [h for h in self._history if h.step in held and h.step > spike_step - k]
        steps = [h for h in steps if h.step <= spike_step + k]
        if not any(h.step == spike_step for h in steps) or len(steps) < 2:
            return None
        t, p, u = len(steps), len(layout.params), len(layout.units)
        per_param = np.full((t, len(RING_STATS), p), np.nan)
        plans = self.probe.ring.plans if self.probe.ring is not None else {}
        for key, rows in row_steps.items():
            cols = plans[key].cols
            for i, h in enumerate(steps):
                r = h.step % k
                if rows[r] == h.step:
                    per_param[i, :, cols] = values[r, :, cols]
        stats: dict[str, np.ndarray] = {}
        for j, name in enumerate(RING_STATS):
            stats[name] = per_unit(per_param[:, j, :], layout.unit_of, u, "sum" if name == "exp_avg_sq" else "l2")
        grads = np.stack([h.grads if len(h.grads) == p else np.full(p, np.nan) for h in steps])
        stats["grad"] = per_unit(grads, layout.unit_of, u)
        attention = np.full((t, u), np.nan)
        for a, name in enumerate(layout.attention):
            attention[:, layout.unit_index(name)] = [h.attention[a] if a < len(h.attention) else np.nan for h in steps]
        stats["attention_logit"] = attention
        lse = np.full((t, u), np.nan)
        if layout.output is not None:
            lse[:, layout.unit_index(layout.output)] = [h.lse for h in steps]
        stats["output_lse"] = lse
        keys = {k_ for k_ in layout.unit_lr if k_ is not None}
        lrs = {key: np.array([h.lrs.get(key, np.nan) for h in steps]) for key in keys}
        return SpikeWindow(np.array([h.step for h in steps]), spike_step, list(layout.units), stats, lrs,
                           list(layout.unit_lr), np.array([h.loss for h in steps]),
                           np.array([h.inputs for h in steps], dtype=np.float64))

    def _finding(self, spike: LossSpike, verdict: Optional[SpikeVerdict]) -> Finding:
        rise = f"the training loss jumped to {spike.loss:.4g} at step {spike.step} (robust z {spike.z:.3g} " \
               f"over the last {spike.baseline_steps} steps: median {spike.median:.4g})"
        evidence: dict[str, Any] = {"loss": spike.loss, "z": spike.z, "median": spike.median, "scale": spike.scale,
                                    "baseline_steps": spike.baseline_steps}
        if verdict is None:
            evidence.update(first_mover=None, lead_steps=None, cause="unknown", ranked=[])
            return self.finding(rise + "; the spike ring no longer held the steps before it",
                                step=spike.step, severity="info", evidence=evidence)
        evidence.update(first_mover=verdict.first_mover, lead_steps=verdict.lead_steps, cause=verdict.cause,
                        ranked=[{"module": m.unit, "score": round(m.score, 3), "lead_steps": m.lead_steps, "stat": m.stat}
                                for m in verdict.ranked[:TOP]],
                        **verdict.figures)
        evidence["series"] = self._series(spike.step, verdict)
        if verdict.first_mover is None:
            return self.finding(rise + "; no module left its baseline before it", step=spike.step,
                                severity="info", evidence=evidence)
        onset = spike.step - (verdict.lead_steps or 0)
        where = f"{verdict.first_mover} moved first, {verdict.lead_steps} step(s) before: {verdict.why}"
        if verdict.cause == "unknown":
            return self.finding(f"{rise}; {where}", module=verdict.first_mover, step=spike.step,
                                onset_step=onset, severity="info", evidence=evidence)
        return self.finding(f"{rise}; {where}; cause: {verdict.cause}", module=verdict.first_mover,
                            step=spike.step, onset_step=onset, severity="warning", evidence=evidence,
                            next_check=NEXT_CHECKS.get(verdict.cause))

    def _series(self, spike_step: int, verdict: SpikeVerdict) -> dict[str, Any]:
        """The top movers' figures over the window, for the finding and TensorBoard."""
        window = verdict.window
        if window is None:
            return {}
        out: dict[str, Any] = {"steps": [int(s) for s in window.steps]}
        if window.loss is not None:
            out["loss"] = [float(x) for x in window.loss]
        for m in verdict.ranked[:TOP]:
            rows: dict[str, list[float]] = {}
            for stat in ("grad", "update", "weight", m.stat):
                values = window.series(stat, m.index)
                if np.isfinite(values).any():
                    rows[stat] = [float(x) for x in values]
            out[m.unit] = rows
        return out
