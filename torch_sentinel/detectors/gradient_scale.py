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
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from typing import ClassVar, Optional

import numpy as np
import torch

from .._collect.compat import is_compiling as _is_compiling
from .._collect.depth import layer_depths
from .._collect.probe import Probe, ProbeHost
from .._collect.probes.clip import preclip_grad_norms
from .._collect.records import StepRecord
from .._findings import Finding
from ._common import threshold, trained_rows
from .base import Detector, RunContext

__all__ = ["ExplodingGradientDetector", "VanishingGradientDetector", "layer_norms"]

_WEIGHTED = ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
             "ConvTranspose3d", "Bilinear", "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell",
             "NonDynamicallyQuantizableLinear", "LazyLinear", "LazyConv2d")


def _layers_unordered(ctx: RunContext) -> list[tuple[str, list[str]]]:
    """(layer, its weight parameters), in parameter order."""
    by_owner: dict[str, list[str]] = {}
    for p in ctx.param_names:
        owner = ctx.owner(p)
        leaf = p.rpartition(".")[2]
        if owner is not None and ctx.module_types.get(owner, "") in _WEIGHTED and leaf.startswith("weight"):
            by_owner.setdefault(owner, []).append(p)
    return list(by_owner.items())


def _layers(ctx: RunContext) -> list[tuple[str, list[str]]]:
    """(layer, its weight parameters) in forward order."""
    by_owner = dict(_layers_unordered(ctx))
    order = [ctx.module_names[s] for s in ctx.forward_order()]
    return [(m, by_owner[m]) for m in order if m in by_owner]


class _LayerPlan:
    """Where each layer's weight-gradient slots and output-gradient slot sit in a record: index
    arrays built once per parameter layout, so a step's per-layer figures are a few numpy ops
    instead of a Python loop over every parameter."""

    def __init__(self, keys: list[str], layers: list[tuple[str, list[str]]], module_names: Sequence[str]) -> None:
        self.keys = keys
        self.layers = layers
        self._index = {k: i for i, k in enumerate(keys)}
        self.param_idx = np.array([self._index[p] for _, params in layers for p in params], dtype=np.int64)
        self.layer_of = np.array([i for i, (_, params) in enumerate(layers) for _ in params], dtype=np.int64)
        first = {n: i for i, n in reversed(list(enumerate(module_names)))}
        self.slots = np.array([first.get(layer, -1) for layer, _ in layers], dtype=np.int64)

    def fits(self, keys: list[str]) -> bool:
        return self.keys is keys or self.keys == keys

    def norms(self, rec: StepRecord, grads: np.ndarray) -> list[tuple[str, float]]:
        """Per-layer weight-gradient norms (sqrt of the sum of squares, summed in parameter
        order), skipping layers whose present gradients are all absent or zero."""
        vals = grads[self.param_idx]
        owners = self.layer_of
        absent = set(rec.meta.grad_missing) | set(rec.meta.frozen)
        if absent:
            gone = np.zeros(len(self.keys), dtype=bool)
            gone[[self._index[n] for n in absent if n in self._index]] = True
            keep = ~gone[self.param_idx]
            vals, owners = vals[keep], owners[keep]
        n = len(self.layers)
        sq = np.bincount(owners, weights=vals * vals, minlength=n)
        positive = np.bincount(owners[vals > 0], minlength=n) > 0
        return [(self.layers[i][0], math.sqrt(sq[i])) for i in np.flatnonzero(positive).tolist()]

    def output_amplitudes(self, rec: StepRecord) -> tuple[np.ndarray, np.ndarray]:
        """(layer indices touched this step, in order; their largest |output gradient|)."""
        lo = rec.array("outgrad.min")[self.slots].astype(np.float64)
        hi = rec.array("outgrad.max")[self.slots].astype(np.float64)
        touched = np.flatnonzero(hi >= lo)
        return touched, np.maximum(np.abs(lo[touched]), np.abs(hi[touched]))


def layer_norms(rec: StepRecord, layers: list[tuple[str, list[str]]]) -> list[tuple[str, float]]:
    """Per-layer weight-gradient norms of one step, skipping layers without gradients."""
    return _LayerPlan(rec.keys("grad_norm"), layers, []).norms(rec, preclip_grad_norms(rec)) if layers else []


class _GradientScale(Detector):
    boundary = "gradients"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.min_steps = int(threshold(self, "min_steps"))
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
        self._plan_cache: Optional[_LayerPlan] = None

    def _plan(self, rec: StepRecord) -> _LayerPlan:
        keys = rec.keys("grad_norm")
        plan = self._plan_cache
        if plan is None or not plan.fits(keys):
            plan = self._plan_cache = _LayerPlan(keys, self._layers or [], self.ctx.module_names)
        return plan

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if self._reported:
            return []  # one verdict a run: what later steps show changes nothing
        rows = trained_rows(records)
        if rows and self._layers is None:
            self._layers = _layers(self.ctx)
        for rec in rows:
            if rec.meta.amp:
                continue  # scaled gradients: the scaler owns their magnitude
            plan = self._plan(rec)
            grads = preclip_grad_norms(rec)
            norms = plan.norms(rec, grads) if self._layers else []
            total = float(np.sqrt((grads**2).sum()))  # what clipping saw
            if math.isfinite(total):
                self._total_count += 1
                if len(self._first_totals) < self.min_steps:
                    self._first_totals.append((rec.step, total))
                self._totals.append((rec.step, total))
            if len(norms) >= 3 and all(math.isfinite(v) for _, v in norms):
                (fl, f), (ll, last) = self._ends(norms)
                ratio = f / last if last > 0 else math.inf
                self._ratios.append((rec.step, ratio, f, last, fl, ll))
            signal = self._output_signal(rec, plan)
            if signal is not None:
                self._signal.append(signal)
        return self.verdict()

    def finish(self) -> Iterable[Finding]:
        return [] if self._reported else self.verdict()

    def verdict(self) -> list[Finding]:
        raise NotImplementedError

    def _ends(self, norms: list[tuple[str, float]]) -> tuple[tuple[str, float], tuple[str, float]]:
        """The (layer, norm) at the input end and at the loss end."""
        return norms[0], norms[-1]

    def _output_signal(self, rec: StepRecord, plan: _LayerPlan) -> Optional[tuple[int, float, float, float, str, str]]:
        """(step, first/last ratio, first, last, names) of the max |gradient| into layer outputs."""
        if not rec.meta.outgrad_complete or not self._layers or len(self._layers) < 3:
            return None  # compare layers only on steps where every output gradient was reduced
        touched, amps = plan.output_amplitudes(rec)
        if len(amps) < 3 or not np.isfinite(amps).all() or amps[-1] <= 0:
            return None
        f, last = float(amps[0]), float(amps[-1])
        fl, ll = self._layers[int(touched[0])][0], self._layers[int(touched[-1])][0]
        self._signal_hops = len(amps) - 1
        return (rec.step, f / last, f, last, fl, ll)

    def _median(self, series: Optional[collections.deque[tuple[int, float, float, float, str, str]]] = None,
                ) -> Optional[tuple[float, float, float, str, str, list[int]]]:
        recent = list(self._ratios if series is None else series)
        if len(recent) < self.min_steps:
            return None
        r = np.array([x[1:4] for x in recent], dtype=np.float64)
        return (float(np.median(r[:, 0])), float(np.median(r[:, 1])), float(np.median(r[:, 2])),
                recent[-1][4], recent[-1][5], [x[0] for x in recent])


class VanishingGradientDetector(_GradientScale, Probe):
    kind = "vanishing_gradient"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_steps": 5, "ratio": 1e-3, "first_norm": 1e-4}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self._weights: dict[int, str] = {}
        self._depths: Optional[dict[str, int]] = None

    def setup(self, host: ProbeHost) -> None:
        names = {n for layer, params in _layers_unordered(self.ctx) for n in params}
        self._weights = {id(p): self.ctx.owner(n) or "" for n, p in host.params if n in names}

    def on_backward(self, loss: torch.Tensor) -> None:
        if self._depths is None and self._weights and not _is_compiling():
            self._depths = layer_depths(loss, self._weights)  # once: a host walk, no device op

    def _ends(self, norms: list[tuple[str, float]]) -> tuple[tuple[str, float], tuple[str, float]]:
        depths = self._depths
        known = [(layer, v, depths[layer]) for layer, v in norms if depths and layer in depths]
        if len(known) < 3:
            return norms[0], norms[-1]
        deepest, shallowest = max(d for _, _, d in known), min(d for _, _, d in known)
        first = max(((lay, v) for lay, v, d in known if d == deepest), key=lambda x: x[1])
        last = max(((lay, v) for lay, v, d in known if d == shallowest), key=lambda x: x[1])
        return first, last

    def verdict(self) -> list[Finding]:
        m = self._median()
        if m is None:
            return []
        ratio, first, last, fl, ll, steps = m
        lim_ratio = threshold(self, "ratio")
        lim_first = threshold(self, "first_norm")
        if not (ratio < lim_ratio and first < lim_first):
            return []
        self._reported = True
        return [self.finding(
            f"the gradient reaching the first layer ({fl}) is {ratio:.2g} of the last layer's "
            f"({ll}): norm {first:.3g} vs {last:.3g}, median over {len(steps)} steps",
            module=fl, step=steps[-1], severity="warning",
            evidence={"first_layer": fl, "last_layer": ll, "first_norm": first, "last_norm": last,
                      "ratio": ratio, "steps": steps[:16], "ratio_threshold": lim_ratio},
            next_check="inspect_initialization_and_activations",
        )]


class ExplodingGradientDetector(_GradientScale):
    kind = "exploding_gradient"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_steps": 5, "ratio": 70.0, "per_layer": 1.15,
                                              "growth": 1e3}

    def verdict(self) -> list[Finding]:
        lim_ratio = threshold(self, "ratio")
        lim_per_layer = threshold(self, "per_layer")
        growth = threshold(self, "growth")
        m = self._median(self._signal)
        hops = max(self._signal_hops, 1)
        # ratio ** (1 / hops), not per_layer ** hops: that overflows a float past ~5,000 layers.
        if m is not None and m[0] > lim_ratio and m[0] ** (1.0 / hops) > lim_per_layer:
            ratio, first, last, fl, ll, steps = m
            per_layer = ratio ** (1.0 / hops)
            self._reported = True
            return [self.finding(
                f"the largest gradient flowing into a layer's output grows {ratio:.3g}x from the "
                f"last layer ({ll}) back to the first "
                f"({fl}), {per_layer:.3g}x per layer over {hops + 1} layers: norm {first:.3g} "
                f"vs {last:.3g}, median over {len(steps)} steps",
                module=fl, step=steps[-1], severity="warning",
                evidence={"first_layer": fl, "last_layer": ll, "first_norm": first,
                          "last_norm": last, "ratio": ratio, "per_layer_growth": per_layer,
                          "layers": hops + 1, "steps": steps[:16],
                          "ratio_threshold": lim_ratio, "per_layer_threshold": lim_per_layer},
                next_check="lower_learning_rate_or_clip_gradients",
            )]
        if self._total_count >= 2 * self.min_steps:
            base = float(np.median([t for _, t in self._first_totals]))
            recent = list(self._totals)
            now = float(np.median([t for _, t in recent]))
            if base > 0 and now > growth * base:
                self._reported = True
                return [self.finding(
                    f"the total gradient norm grew {now / base:.3g}x: median {now:.3g} over "
                    f"steps {recent[0][0]}-{recent[-1][0]} vs {base:.3g} at the start",
                    module=None, step=recent[-1][0], severity="warning",
                    evidence={"initial_norm": base, "recent_norm": now, "growth": now / base,
                              "steps": [s for s, _ in recent], "growth_threshold": growth},
                    next_check="lower_learning_rate_or_clip_gradients",
                )]
        return []
