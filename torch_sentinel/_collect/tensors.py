"""Tensor helpers shared by the probes: walking outputs, what can be reduced, exact evidence."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]  # not in the stubs

from .._record import TensorEvidence
from .transfer import read_now

__all__ = [
    "NATIVE_DTYPES", "STANDARD_LAYERS", "VALUE_PRESERVING", "all_finite", "foreach_norms", "iter_tensors",
    "materialized", "nbytes", "reduces", "reducible", "tensor_evidence", "unwatched_kind",
]

#: Floating dtypes every reduction supports on every device; others (float8, float4) are
#: probed once per device (:func:`reduces`).
NATIVE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

_SUPPORT: dict[tuple[torch.dtype, str], bool] = {}

#: Whether ``_foreach_norm`` takes ``dtype=`` (checked, not assumed, across torch versions).
try:
    _NORM_DTYPE = "ScalarType" in str(torch.ops.aten._foreach_norm.Scalar._schema)
except (AttributeError, RuntimeError):  # pragma: no cover - older torch
    _NORM_DTYPE = False


def iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors inside a module's output: tensors, tuples, lists, dicts, ``ModelOutput``s and
    dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4:
        if isinstance(obj, (list, tuple)):
            for item in obj:
                yield from iter_tensors(item, depth + 1)
        elif isinstance(obj, Mapping):
            for item in obj.values():
                yield from iter_tensors(item, depth + 1)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for field in dataclasses.fields(obj):
                yield from iter_tensors(getattr(obj, field.name, None), depth + 1)


#: Every floating dtype this torch has (float8 variants included).
_FLOATING = frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point)


def reducible(t: torch.Tensor) -> bool:
    """A tensor whose min/max can be folded into a slot: dense, floating, non-empty.

    Called for every hooked output and output gradient: a dtype lookup and a layout identity
    check cost less than ``is_floating_point()`` and ``is_sparse``."""
    return (t.dtype in _FLOATING and t.layout is not torch.sparse_coo and not t.is_meta and not t.is_nested
            and t.numel() > 0)


def unwatched_kind(t: torch.Tensor) -> str:
    """Why a module output is not reduced, when something that could hold a NaN is lost ("" when
    nothing is: integer and bool tensors cannot hold NaN or Inf, empty ones hold nothing)."""
    if t.is_nested:
        return "nested tensors"
    if t.is_sparse:
        return "sparse tensors"
    if t.is_complex():
        return "complex tensors"
    return ""


def materialized(p: torch.Tensor) -> bool:
    """False for the parameters of a lazy module (``nn.LazyLinear``) before its first forward:
    they have no shape yet, and any torch op on them raises."""
    return not isinstance(p, UninitializedTensorMixin)


def nbytes(p: torch.Tensor) -> int:
    """Bytes held by ``p``; 0 while it is an uninitialised lazy parameter."""
    return p.numel() * p.element_size() if materialized(p) else 0


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


def reduces(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``aminmax`` and ``_foreach_norm`` run on ``dtype`` tensors on ``device``.

    The four native floating dtypes always do; any other (float8 variants, float4) is tried
    once on a one-element tensor and remembered (host-side dispatch errors: no device read).
    """
    if dtype in NATIVE_DTYPES:
        return True
    key = (dtype, str(device))
    ok = _SUPPORT.get(key)
    if ok is None:
        try:
            probe = torch.zeros(1, device=device).to(dtype)
            torch.aminmax(probe)
            torch._foreach_norm([probe])
            ok = True
        except (RuntimeError, NotImplementedError, TypeError):
            ok = False
        _SUPPORT[key] = ok
    return ok


def foreach_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms of ``tensors`` with one ``_foreach_norm`` per precision class.

    fp16/bf16 norms are taken in float32 (a norm of ordinary fp16 values can exceed fp16's
    65,504); float64 tensors keep float64 norms (beyond float32's ~3.4e38). A float32-only
    list is a single plain ``_foreach_norm``, as before.
    """
    if not _NORM_DTYPE or all(t.dtype is torch.float32 for t in tensors):
        return list(torch._foreach_norm(tensors))
    wide = [i for i, t in enumerate(tensors) if t.dtype is torch.float64]
    narrow = [i for i, t in enumerate(tensors) if t.dtype is not torch.float64]
    out: list[torch.Tensor] = [tensors[0]] * len(tensors)
    if narrow:
        for i, n in zip(narrow, torch._foreach_norm([tensors[i] for i in narrow], 2, dtype=torch.float32)):
            out[i] = n
    if wide:
        for i, n in zip(wide, torch._foreach_norm([tensors[i] for i in wide])):
            out[i] = n
    return out


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype every comparison supports: float8 values upcast exactly to float32."""
    d = t.detach()
    return d if d.dtype in NATIVE_DTYPES else d.float()


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite in its own dtype. Cold path: reads the device."""
    return bool(read_now(torch.isfinite(_comparable(t)).all()))


def tensor_evidence(t: torch.Tensor) -> TensorEvidence:
    """Exact counts for an offending tensor, in its own dtype. Cold path: reads the device."""
    ev = TensorEvidence(shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""))
    d = _comparable(t)
    finite = torch.isfinite(d)
    ev.nan = int(read_now(torch.isnan(d).sum()))
    ev.posinf = int(read_now((d == math.inf).sum()))
    ev.neginf = int(read_now((d == -math.inf).sum()))
    if bool(read_now(finite.any())):
        vals = d[finite]
        ev.min = read_now(vals.min())
        ev.max = read_now(vals.max())
    return ev
