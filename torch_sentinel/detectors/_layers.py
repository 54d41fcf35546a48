"""Layers as the gradient and update detectors see them: modules with weights, in order.

A layer is a module with weights (Linear, Conv, RNN cells); its figures are those of its
``weight*`` parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._collect.probes.norms import GradNorms
from .._collect.probes.outgrad import OutputGradients
from .._record import StepRecord
from .base import RunContext

__all__ = ["LayerPlan", "is_layer_weight", "layer_norms", "layers", "layers_unordered"]

_WEIGHTED = ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
             "ConvTranspose3d", "Bilinear", "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell",
             "NonDynamicallyQuantizableLinear", "LazyLinear", "LazyConv2d")


def is_layer_weight(param: str, owner_type: str) -> bool:
    """Whether ``param`` is a weight of a layer (a module of a weighted type)."""
    return owner_type in _WEIGHTED and param.rpartition(".")[2].startswith("weight")


def layers_unordered(ctx: RunContext) -> list[tuple[str, list[str]]]:
    """(layer, its weight parameters), in parameter order."""
    by_owner: dict[str, list[str]] = {}
    for p in ctx.param_names:
        owner = ctx.owner(p)
        if owner is not None and is_layer_weight(p, ctx.module_types.get(owner, "")):
            by_owner.setdefault(owner, []).append(p)
    return list(by_owner.items())


def layers(ctx: RunContext) -> list[tuple[str, list[str]]]:
    """(layer, its weight parameters) in forward order."""
    by_owner = dict(layers_unordered(ctx))
    order = [ctx.module_names[s] for s in ctx.forward_order()]
    return [(m, by_owner[m]) for m in order if m in by_owner]


class LayerPlan:
    """Where each layer's weight-gradient slots and output-gradient slot sit in a record: index
    arrays built once per parameter layout, so a step's per-layer figures are a few numpy ops
    instead of a Python loop over every parameter."""

    def __init__(self, keys: Sequence[str], layers: list[tuple[str, list[str]]], module_names: Sequence[str]) -> None:
        self.keys = keys
        self.layers = layers
        self.names = [layer for layer, _ in layers]
        self._index = {k: i for i, k in enumerate(keys)}
        self.param_idx = np.array([self._index[p] for _, params in layers for p in params], dtype=np.int64)
        self.layer_of = np.array([i for i, (_, params) in enumerate(layers) for _ in params], dtype=np.int64)
        first = {n: i for i, n in reversed(list(enumerate(module_names)))}
        self.slots = np.array([first.get(layer, -1) for layer, _ in layers], dtype=np.int64)

    def fits(self, keys: Sequence[str]) -> bool:
        return self.keys is keys or self.keys == keys

    def present_norms(self, grads: GradNorms) -> tuple[np.ndarray, np.ndarray]:
        """(indices into ``names`` of the layers with a nonzero gradient, in order; their
        weight-gradient norms, float64): sqrt of the sum of squares, summed in parameter order.
        Layers whose present gradients are all absent or zero are skipped."""
        vals = grads.values[self.param_idx]
        owners = self.layer_of
        absent = set(grads.missing) | set(grads.frozen)
        if absent:
            gone = np.zeros(len(self.keys), dtype=bool)
            gone[[self._index[n] for n in absent if n in self._index]] = True
            keep = ~gone[self.param_idx]
            vals, owners = vals[keep], owners[keep]
        n = len(self.layers)
        sq = np.bincount(owners, weights=vals * vals, minlength=n)
        positive = np.bincount(owners[vals > 0], minlength=n) > 0
        idx = positive.nonzero()[0]
        return idx, np.sqrt(sq[idx])

    def norms(self, grads: GradNorms) -> list[tuple[str, float]]:
        """Per-layer weight-gradient norms as (layer, norm), as :meth:`present_norms`."""
        idx, norms = self.present_norms(grads)
        return list(zip(map(self.names.__getitem__, idx.tolist()), norms.tolist()))

    def output_amplitudes(self, outgrads: OutputGradients) -> tuple[np.ndarray, np.ndarray]:
        """(layer indices touched this step, in order; their largest |output gradient|)."""
        lo = outgrads.lo[self.slots].astype(np.float64)
        hi = outgrads.hi[self.slots].astype(np.float64)
        touched = np.flatnonzero(hi >= lo)
        return touched, np.maximum(np.abs(lo[touched]), np.abs(hi[touched]))


def layer_norms(rec: StepRecord, layers: list[tuple[str, list[str]]]) -> list[tuple[str, float]]:
    """Per-layer weight-gradient norms of one step, skipping layers without gradients."""
    grads = rec.fact(GradNorms)
    return LayerPlan(list(grads.names), layers, []).norms(grads) if layers and grads is not None else []
