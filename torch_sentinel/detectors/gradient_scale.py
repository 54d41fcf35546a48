"""``exploding_gradient`` and ``vanishing_gradient``: per-layer gradient norms across depth.

A layer is a module with weights (Linear, Conv, RNN cells); its gradient norm is the norm of
its weight gradients at the optimizer step. For ``exploding_gradient`` layers are ordered by
forward execution, so "first" is the layer nearest the input and "last" the one nearest the
loss. ``vanishing_gradient`` takes depth from the autograd graph instead (``_collect/depth.py``,
walked once at the first backward): the first layers are all those deepest from the loss and
the gradient reaching that depth is the largest among them, so a transformer's query
projection, tiny by construction beside the value projection at the same depth, is not read
as a vanishing gradient.

Thresholds (AUTOTRAINER's, per step, taken as a median over the window):
- vanishing: first/last layer weight-gradient-norm ratio below ``vanishing_gradient.ratio`` =
  1e-3 and the first layer's norm below ``vanishing_gradient.first_norm`` = 1e-4;
- exploding: first/last ratio above ``exploding_gradient.ratio`` = 70, measured on the largest
  |gradient| flowing into each layer's *output* (the backpropagated signal). A weight gradient
  is that signal times the layer's input, and when a bad initialisation inflates both
  (activations forward, gradients backward) the weight-gradient ratio stays near 1 and hides
  the explosion; the output-gradient ratio does not. The ratio must also mean a steep growth
  per layer: at least ``exploding_gradient.per_layer`` = 1.15x on average (geometric mean)
  across the weighted layers it crosses. Up to 31 layers the 70x ratio already implies more
  than that, so those models are judged as before; in a deep stack a mild per-layer growth
  compounds: a 100-module Linear/Tanh stack with PyTorch's tanh gain (5/3) grows 1.10x per
  layer, 80x over 50 layers (1.2e4x over 100), and trains normally even at lr 1e-2, while a
  bad init (std 1 on 16-wide ReLU layers) grows 2.4x per layer. Or: the total gradient norm
  above ``exploding_gradient.growth`` = 1e3 times its median over the run's first steps.
Both need ``*.min_steps`` = 5 steps and at least 3 layers (a ratio over 2 layers says little).

Each states a claim the run must bear out before it is a warning (otherwise it is ``info``,
saying what contradicted it): a loss improving fast contradicts both (``_evidence.py``), and
"vanishing" needs the first layers to lag the rest in their *updates*, not only in their
gradients: an adaptive optimizer (Adam normalises each update by the gradient's own scale) moves
a layer whose gradient is 1e-6 of the last one's as much as any other, and a fine-tune under the
HF Trainer does exactly that. The lag is the first layer's update/weight ratio over the last
layer's on the sampled update steps (``UpdateNorms``), below ``vanishing_gradient.update_lag``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import ClassVar, Optional

import numpy as np
import torch

from .._collect.compat import is_compiling as _is_compiling
from .._collect.depth import layer_depths
from .._collect.probe import Probe, ProbeHost
from .._collect.probes.norms import GradNorms, WeightNorms
from .._collect.probes.outgrad import OutputGradients
from .._collect.probes.updates import UpdateNorms
from .._findings import Finding
from .._record import Fact, StepRecord
from ._common import trained
from ._evidence import LossHistory, Support
from ._layers import LayerPlan, is_layer_weight, layers
from ._robust import median
from .base import Detector, Threshold

__all__ = ["ExplodingGradientDetector", "LayerDepths", "VanishingGradientDetector"]


@dataclasses.dataclass(frozen=True)
class LayerDepths(Fact):
    """Each layer's depth from the loss in the autograd graph (walked once, at the first
    backward): published on that step."""

    depths: dict[str, int]


class DepthWalk(Probe):
    """Walks the loss's graph once, on the host, for the depth of each layer's weights."""

    name = "layer_depths"
    publishes = (LayerDepths,)

    def __init__(self) -> None:
        self._host: Optional[ProbeHost] = None
        self._done = False

    def setup(self, host: ProbeHost) -> None:
        self._host = host

    def on_backward(self, loss: torch.Tensor) -> None:
        c = self._host
        if self._done or c is None or _is_compiling():
            return
        self._done = True
        types = {name: type(m).__name__ for name, m in c.map.modules}
        owners = c.map.param_owner
        weights = {id(p): owners[n] for n, p in c.params
                   if is_layer_weight(n, types.get(owners.get(n, ""), ""))}
        if weights:
            c.publish(LayerDepths(layer_depths(loss, weights)))  # a host walk, no device op

class _GradientScale(Detector):
    rung = "gradients"
    reads: ClassVar[tuple[type[Fact], ...]] = (GradNorms, OutputGradients)

    def setup(self) -> None:
        self.min_steps = int(self.threshold("min_steps"))
        self.loss = LossHistory()
        self._layers: Optional[list[tuple[str, list[str]]]] = None
        # Bounded: the medians look at the last 20 steps; growth compares with the first steps.
        window = max(self.min_steps, 20)
        self._ratios: collections.deque[tuple[int, float, float, float, str, str]] = collections.deque(maxlen=window)
        self._signal: collections.deque[tuple[int, float, float, float, str, str]] = collections.deque(maxlen=window)
        #: How many layer-to-layer hops the latest output-gradient signal crossed.
        self._signal_hops = 0
        self._first_totals: list[tuple[int, float]] = []
        self._totals: collections.deque[tuple[int, float]] = collections.deque(maxlen=self.min_steps)
        self._total_count = 0
        self._reported = False
        #: Index arrays over the record layout; rebuilt from the run, never checkpointed.
        self._plan_cache: Optional[LayerPlan] = None

    def _plan(self, grads: GradNorms) -> LayerPlan:
        plan = self._plan_cache
        if plan is None or not plan.fits(grads.names):
            plan = self._plan_cache = LayerPlan(grads.names, self._layers or [], self.ctx.module_names)
        return plan

    def update(self, record: StepRecord) -> None:
        # One verdict a run: what later steps show changes nothing. Scaled gradients (AMP):
        # the scaler owns their magnitude.
        self.loss.add(record)
        grads = record.fact(GradNorms)
        if self._reported or not trained(record) or record.meta.amp or grads is None:
            return
        if self._layers is None:
            self._layers = layers(self.ctx)
        plan = self._plan(grads)
        total = grads.total  # what clipping saw
        if math.isfinite(total):
            self._total_count += 1
            if len(self._first_totals) < self.min_steps:
                self._first_totals.append((record.step, total))
            self._totals.append((record.step, total))
        if self._layers:
            # Per record over every layer: numpy passes, not a Python loop (250 layers on a
            # 500-module stack).
            idx, norms = plan.present_norms(grads)
            if len(norms) >= 3 and np.isfinite(norms).all():
                i, j = self._ends(plan, idx, norms)
                f, last = float(norms[i]), float(norms[j])
                ratio = f / last if last > 0 else math.inf
                self._ratios.append((record.step, ratio, f, last, plan.names[idx[i]], plan.names[idx[j]]))
        outgrads = record.fact(OutputGradients)
        signal = self._output_signal(outgrads, plan) if outgrads is not None else None
        if signal is not None:
            self._signal.append((record.step, *signal))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        return [] if self._reported else self.verdict()

    def verdict(self) -> list[Finding]:
        raise NotImplementedError

    def corroborated(self, found: Finding, extra: Optional[Support] = None) -> Finding:
        """``found`` as a warning if the loss history (and ``extra``, the detector's own second
        figure) support it, else as info saying what did not."""
        loss = self.loss.not_improving_fast()
        against = [x for x in (loss, extra) if x is not None and x.verdict in ("contradicted", "unsupported")]
        evidence = {**found.evidence, **loss.evidence()}
        if extra is not None:
            evidence.update({"second_figure": extra.verdict, "second_figure_says": extra.reason, **extra.figures})
        if not against:
            return dataclasses.replace(found, evidence=evidence)
        why = "; ".join(x.reason for x in against)
        return dataclasses.replace(
            found, severity="info", evidence=evidence, next_check="continue_training_or_collect_more_evidence",
            message=f"{found.message}; but the run does not bear out the claim: {why}")

    def _ends(self, plan: LayerPlan, idx: np.ndarray, norms: np.ndarray) -> tuple[int, int]:
        """Positions in ``idx``/``norms`` (the layers with a gradient, as
        :meth:`LayerPlan.present_norms` gives them) of the layer at the input end and at the
        loss end."""
        return 0, len(norms) - 1

    def _output_signal(self, outgrads: OutputGradients, plan: LayerPlan) -> Optional[tuple[float, float, float, str, str]]:
        """(first/last ratio, first, last, names) of the max |gradient| into layer outputs."""
        if not outgrads.complete or not self._layers or len(self._layers) < 3:
            return None  # compare layers only on steps where every output gradient was reduced
        touched, amps = plan.output_amplitudes(outgrads)
        if len(amps) < 3 or not np.isfinite(amps).all() or amps[-1] <= 0:
            return None
        f, last = float(amps[0]), float(amps[-1])
        fl, ll = self._layers[int(touched[0])][0], self._layers[int(touched[-1])][0]
        self._signal_hops = len(amps) - 1
        return (f / last, f, last, fl, ll)

    def _median(self, series: Optional[collections.deque[tuple[int, float, float, float, str, str]]] = None,
                ) -> Optional[tuple[float, float, float, str, str, list[int]]]:
        recent = list(self._ratios if series is None else series)
        if len(recent) < self.min_steps:
            return None
        r = np.array([x[1:4] for x in recent], dtype=np.float64)
        return (median(r[:, 0]), median(r[:, 1]), median(r[:, 2]),
                recent[-1][4], recent[-1][5], [x[0] for x in recent])


@dataclasses.dataclass(frozen=True)
class _DepthIndex:
    """A layer plan's depths from the loss (-1: not known), and its end members when every
    layer has a gradient (:func:`_end_members`)."""

    plan: LayerPlan
    depth: np.ndarray
    ends: Optional[tuple[np.ndarray, np.ndarray]]


def _end_members(depth: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """Positions, in order, of the deepest and of the shallowest layers among those of known
    depth (``depth >= 0``); None when fewer than 3 have a known depth."""
    known = depth[depth >= 0]
    if len(known) < 3:
        return None
    return np.flatnonzero(depth == known.max()), np.flatnonzero(depth == known.min())


class VanishingGradientDetector(_GradientScale):
    kind = "vanishing_gradient"
    next_check = "inspect_initialization_and_activations"
    hypothesis = "gradients shrink through depth (saturation, poor initialisation)"
    reads = (GradNorms, OutputGradients, LayerDepths, UpdateNorms, WeightNorms)
    thresholds = {
        "min_steps": Threshold(5, "steps, median: one step never decides"),
        "ratio": Threshold(1e-3, "AUTOTRAINER: first/last layer gradient-norm ratio below 1e-3"),
        "first_norm": Threshold(1e-4, "AUTOTRAINER: and the first layer's norm below 1e-4"),
        "update_lag": Threshold(1e-2, "the first layer's update/weight ratio 100x below the last layer's: "
                                      "it learns 100x slower than the rest (issue 25)"),
    }

    def setup(self) -> None:
        super().setup()
        self._depths: Optional[dict[str, int]] = None
        self._depth_index_cache: Optional[_DepthIndex] = None
        #: Per fact ("update", "weight"): its names, and each weight's position there and layer.
        self._layer_index_cache: dict[str, tuple[Sequence[str], np.ndarray, np.ndarray]] = {}
        #: (step, update/weight ratio per layer) of the sampled update steps
        self._update_ratios: collections.deque[tuple[int, dict[str, float]]] = collections.deque(maxlen=8)

    def update(self, record: StepRecord) -> None:
        walked = record.fact(LayerDepths)
        if walked is not None and self._depths is None:
            self._depths = walked.depths
        super().update(record)
        updates, weights = record.fact(UpdateNorms), record.fact(WeightNorms)
        if updates is not None and weights is not None and self._layers and not self._reported:
            uu = self._layer_norms("update", updates.names, updates.values)
            ww = self._layer_norms("weight", weights.names, weights.values)
            keep = np.flatnonzero((ww > 0) & np.isfinite(uu) & np.isfinite(ww))
            if len(keep):
                names = self._layers
                self._update_ratios.append(
                    (record.step, dict(zip((names[i][0] for i in keep.tolist()), (uu[keep] / ww[keep]).tolist()))))

    def _layer_norms(self, what: str, names: Sequence[str], values: np.ndarray) -> np.ndarray:
        """Each layer's norm over its weights (sqrt of the sum of squares; a weight missing from
        ``names`` counts 0), in ``self._layers`` order. The index arrays are made once per list
        of names."""
        layers = self._layers
        assert layers is not None
        cached = self._layer_index_cache.get(what)
        if cached is None or cached[0] is not names:
            index = {n: i for i, n in enumerate(names)}
            pairs = [(index[p], i) for i, (_, params) in enumerate(layers) for p in params if p in index]
            cached = self._layer_index_cache[what] = (
                names, np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64))
        _, at, layer = cached
        v = np.asarray(values, dtype=np.float64)[at]
        return np.sqrt(np.bincount(layer, weights=v * v, minlength=len(layers)))

    def _update_lag(self, first: str, last: str) -> Support:
        """Whether ``first`` lags ``last`` in its updates: the median over the sampled steps of
        the ratio of their update/weight ratios."""
        lags = [r[first] / r[last] for _, r in self._update_ratios
                if first in r and last in r and r[last] > 0]
        if not lags:
            return Support("unsupported", "the updates were not measured (no sampled update step), so the "
                                          "first layers' lag in learning is not shown")
        lag = median(lags)
        limit = self.threshold("update_lag")
        figures = {"update_lag": lag, "update_lag_threshold": limit, "update_lag_samples": len(lags)}
        if lag < limit:
            return Support("supported", f"{first}'s update/weight ratio is {lag:.2g} of {last}'s", figures)
        return Support("unsupported", f"the first layers do not lag in their updates: {first}'s update/weight "
                                      f"ratio is {lag:.2g} of {last}'s (an optimizer that scales each update "
                                      "to its own gradient, as Adam does, moves them as much as the rest)", figures)

    def _ends(self, plan: LayerPlan, idx: np.ndarray, norms: np.ndarray) -> tuple[int, int]:
        """The first layers are those deepest from the loss in the graph, the last ones the
        shallowest; at each end, the one with the largest gradient (the first in forward order
        on a tie). Forward order's ends when fewer than 3 of the layers have a known depth."""
        depth = self._depth_index(plan)
        if depth is None:
            return 0, len(norms) - 1
        # Every layer has a gradient on the usual step: its ends were found once.
        ends = depth.ends if len(idx) == len(depth.depth) else _end_members(depth.depth[idx])
        if ends is None:
            return 0, len(norms) - 1
        deep, shallow = ends
        return int(deep[np.argmax(norms[deep])]), int(shallow[np.argmax(norms[shallow])])

    def _depth_index(self, plan: LayerPlan) -> Optional[_DepthIndex]:
        """Each of ``plan``'s layers' depth from the loss (-1: not known), made once per plan."""
        if not self._depths:
            return None
        cached = self._depth_index_cache
        if cached is None or cached.plan is not plan:
            depths = self._depths
            depth = np.array([depths.get(layer, -1) for layer in plan.names], dtype=np.int64)
            cached = self._depth_index_cache = _DepthIndex(plan, depth, _end_members(depth))
        return cached

    def verdict(self) -> list[Finding]:
        m = self._median()
        if m is None:
            return []
        ratio, first, last, fl, ll, steps = m
        lim_ratio = self.threshold("ratio")
        lim_first = self.threshold("first_norm")
        if not (ratio < lim_ratio and first < lim_first):
            return []
        self._reported = True
        return [self.corroborated(self.finding(
            f"the gradient reaching the first layer ({fl}) is {ratio:.2g} of the last layer's "
            f"({ll}): norm {first:.3g} vs {last:.3g}, median over {len(steps)} steps",
            module=fl, step=steps[-1], severity="warning",
            evidence={"first_layer": fl, "last_layer": ll, "first_norm": first, "last_norm": last,
                      "ratio": ratio, "steps": steps[:16], "ratio_threshold": lim_ratio},
        ), self._update_lag(fl, ll))]


class ExplodingGradientDetector(_GradientScale):
    kind = "exploding_gradient"
    next_check = "lower_learning_rate_or_clip_gradients"
    hypothesis = "gradients grow through depth or time"
    explains = ("diverging",)
    thresholds = {
        "min_steps": Threshold(5, "steps, median: one step never decides"),
        "ratio": Threshold(70.0, "AUTOTRAINER: first/last layer ratio above 70"),
        "per_layer": Threshold(1.15, "a steep growth per layer: a 100-layer tanh stack at PyTorch's gain grows "
                                     "1.10x per layer and trains; a bad init grows 2.4x"),
        "growth": Threshold(1e3, "the total gradient norm 1000x its median over the first steps"),
    }

    def verdict(self) -> list[Finding]:
        lim_ratio = self.threshold("ratio")
        lim_per_layer = self.threshold("per_layer")
        growth = self.threshold("growth")
        m = self._median(self._signal)
        hops = max(self._signal_hops, 1)
        # ratio ** (1 / hops), not per_layer ** hops: that overflows a float past ~5,000 layers.
        if m is not None and m[0] > lim_ratio and m[0] ** (1.0 / hops) > lim_per_layer:
            ratio, first, last, fl, ll, steps = m
            per_layer = ratio ** (1.0 / hops)
            self._reported = True
            return [self.corroborated(self.finding(
                f"the largest gradient flowing into a layer's output grows {ratio:.3g}x from the "
                f"last layer ({ll}) back to the first "
                f"({fl}), {per_layer:.3g}x per layer over {hops + 1} layers: norm {first:.3g} "
                f"vs {last:.3g}, median over {len(steps)} steps",
                module=fl, step=steps[-1], severity="warning",
                evidence={"first_layer": fl, "last_layer": ll, "first_norm": first,
                          "last_norm": last, "ratio": ratio, "per_layer_growth": per_layer,
                          "layers": hops + 1, "steps": steps[:16],
                          "ratio_threshold": lim_ratio, "per_layer_threshold": lim_per_layer},
            ))]
        if self._total_count >= 2 * self.min_steps:
            base = median([t for _, t in self._first_totals])
            recent = list(self._totals)
            now = median([t for _, t in recent])
            if base > 0 and now > growth * base:
                self._reported = True
                return [self.corroborated(self.finding(
                    f"the total gradient norm grew {now / base:.3g}x: median {now:.3g} over "
                    f"steps {recent[0][0]}-{recent[-1][0]} vs {base:.3g} at the start",
                    module=None, step=recent[-1][0], severity="warning",
                    evidence={"initial_norm": base, "recent_norm": now, "growth": now / base,
                              "steps": [s for s, _ in recent], "growth_threshold": growth},
                ))]
        return []
