"""Tensor helpers shared by the probes: walking outputs, what can be reduced, exact evidence."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .records import TensorEvidence
from .transfer import read_now

__all__ = ["STANDARD_LAYERS", "VALUE_PRESERVING", "iter_tensors", "reducible", "tensor_evidence"]


def iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors inside a module's output: tensors, tuples, lists, dicts and ``ModelOutput``s."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4:
        if isinstance(obj, (list, tuple)):
            for item in obj:
                yield from iter_tensors(item, depth + 1)
        elif isinstance(obj, Mapping):
            for item in obj.values():
                yield from iter_tensors(item, depth + 1)


def reducible(t: torch.Tensor) -> bool:
    """A tensor whose min/max can be folded into a slot: dense, floating, non-empty."""
    return t.is_floating_point() and not t.is_meta and not t.is_sparse and t.numel() > 0


#: Modules that cannot turn finite inputs into non-finite outputs: activations, dropout,
#: pooling, reshapes. A non-finite value at their output was already non-finite at their input,
#: where the module that produced it is checked, so reducing their outputs again would only cost
#: bandwidth (on a CNN, half of all forward activation passes). Their output *gradients* are
#: still checked: they carry what the next module's backward produced.
VALUE_PRESERVING: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.Softsign,
    nn.LogSigmoid, nn.Softplus, nn.Softmax, nn.LogSoftmax,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
    nn.Identity, nn.Flatten, nn.Unflatten, nn.PixelShuffle, nn.PixelUnshuffle,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
)

#: Layers whose backward turns a finite incoming gradient into a finite one, given finite
#: inputs and weights (norms have eps > 0). See ``probes/outgrad.py``.
STANDARD_LAYERS: tuple[type[nn.Module], ...] = (
    *VALUE_PRESERVING,
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.Embedding,
)


def tensor_evidence(t: torch.Tensor) -> TensorEvidence:
    """Exact counts for an offending tensor. Cold path: reads the device."""
    d = t.detach()
    finite = torch.isfinite(d)
    ev = TensorEvidence(shape=tuple(d.shape), dtype=str(d.dtype).replace("torch.", ""))
    ev.nan = int(read_now(torch.isnan(d).sum()))
    ev.posinf = int(read_now((d == math.inf).sum()))
    ev.neginf = int(read_now((d == -math.inf).sum()))
    if bool(read_now(finite.any())):
        vals = d[finite]
        ev.min = read_now(vals.min())
        ev.max = read_now(vals.max())
    return ev
