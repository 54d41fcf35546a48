"""Exactness: the histogram's figures against counts on torch's own cast, per format."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from torch_sentinel.precision.derive import format_figures, tensor_figures
from torch_sentinel.precision.formats import FORMATS, Format
from torch_sentinel.precision.histogram import DeviceTables, add_histogram
from torch_sentinel.precision.layout import BinLayout

__all__ = ["cast_counts", "run"]

_LAYOUT = BinLayout.default()
_TABLES = DeviceTables(_LAYOUT, torch.device("cpu"))


def cast_counts(x: torch.Tensor, fmt: Format) -> tuple[float, float, float]:
    """(flushed, subnormal, saturated) fractions counted on ``x.to(fmt.dtype)``. e4m3fn's cast
    clamps: there a saturated value is one whose magnitude rounds (nearest-even, 3 fraction
    bits) above 448, i.e. lies above 464."""
    x32 = x.float()
    cast = x32.to(fmt.dtype).float()
    finite = torch.isfinite(x32)
    n = x32.numel()
    flushed = ((x32 != 0) & finite & (cast == 0)).sum().item() / n
    subnormal = (finite & (cast != 0) & (cast.abs() < fmt.min_normal)).sum().item() / n
    if fmt.saturating:
        m, e = torch.frexp(x32.double().abs())
        rounded = torch.round(m * 2.0 ** (fmt.mantissa_bits + 1)) * torch.pow(2.0, (e - fmt.mantissa_bits - 1).double())
        saturated = (finite & (rounded > fmt.max_finite)).sum().item() / n
    else:
        saturated = (finite & ~torch.isfinite(cast)).sum().item() / n
    return flushed, subnormal, saturated


def _histogram_figures(x: torch.Tensor, fmt: Format) -> tuple[float, float, float]:
    row = torch.zeros(_TABLES.width, dtype=torch.int64)
    add_histogram(x, row, _TABLES)
    values = row.numpy()[None]
    tensor = tensor_figures(values[:, :-1], values[:, -1], _LAYOUT)
    f = format_figures(_LAYOUT.tails(values[:, :-1]), tensor, _LAYOUT, fmt)
    return float(f.flushed[0]), float(f.subnormal[0]), float(f.saturated[0])


def _tensor(g: torch.Generator, fmt: Format) -> torch.Tensor:
    """A tensor of random size, distribution, dtype and scale: centred (in log2) anywhere from
    below the format's smallest subnormal to above its largest value, or, half of the time,
    within 3 binades of one of its rounding edges."""
    lo = fmt.min_subnormal_exp - 4
    hi = np.log2(fmt.max_finite) + 4
    dtype = [torch.float32, torch.bfloat16, torch.float16][int(torch.randint(0, 3, (), generator=g))]
    if dtype is torch.float16:
        lo, hi = max(lo, -28), min(hi, 18)
    if dtype is torch.float32:
        lo = max(lo, -150)
    if bool(torch.rand((), generator=g) < 0.5):  # anywhere in the range
        centre = float(torch.empty(()).uniform_(lo, hi, generator=g))
    else:  # within 3 binades of one of the format's rounding edges
        edges = [np.log2(e.value) for e in fmt.edges.values()]
        edge = edges[int(torch.randint(0, len(edges), (), generator=g))]
        centre = min(max(edge + float(torch.empty(()).uniform_(-3, 3, generator=g)), lo), hi)
    n = int(torch.randint(1, 4097, (), generator=g))
    kind = int(torch.randint(0, 3, (), generator=g))
    if kind == 0:
        x = torch.randn(n, generator=g)
    elif kind == 1:  # log-normal magnitudes, 8 binades wide
        x = torch.exp2(torch.randn(n, generator=g) * 4) * torch.sign(torch.randn(n, generator=g))
    else:  # sparse: three quarters zeros
        x = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.25)
    return (x.double() * 2.0**centre).to(dtype)


def run(tensors: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The largest |histogram - cast| per format and figure over ``tensors`` tensors each."""
    out: dict[str, Any] = {}
    for name, fmt in FORMATS.items():
        g = torch.Generator().manual_seed(seed)
        worst = [0.0, 0.0, 0.0]
        nonzero = [0, 0, 0]
        elements = 0
        for _ in range(tensors):
            x = _tensor(g, fmt)
            elements += x.numel()
            got, want = _histogram_figures(x, fmt), cast_counts(x, fmt)
            for i in range(3):
                worst[i] = max(worst[i], abs(got[i] - want[i]))
                nonzero[i] += want[i] > 0
        out[name] = {"tensors": tensors, "elements": elements,
                     "max_error": dict(zip(("flushed", "subnormal", "saturated"), worst)),
                     "tensors_with_nonzero": dict(zip(("flushed", "subnormal", "saturated"), nonzero))}
    return out
