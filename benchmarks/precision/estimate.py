"""The underflow estimate for tensors already rounded to fp16, against the true share.

A gradient computed in fp16 holds no trace of the values that flushed: they are zeros now.
``derive.flushed_share`` estimates them from the values left at fp16's smallest subnormal
(half of those, as for a density flat near 0). Here float32 tensors of three shapes of
distribution are drawn at scales around fp16's smallest subnormal, the true share of their
nonzero values that flush is counted on the cast, and the estimate is made from the
histogram of the *rounded* tensor, as the sentinel sees an fp16 gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_sentinel.precision.derive import flushed_share, format_figures, tensor_figures
from torch_sentinel.precision.formats import FORMATS
from torch_sentinel.precision.histogram import DeviceTables, add_histogram
from torch_sentinel.precision.layout import BinLayout

__all__ = ["run"]

_LAYOUT = BinLayout.default()
_TABLES = DeviceTables(_LAYOUT, torch.device("cpu"))


def _draw(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(n, generator=g)
    if kind == "product of two normals":
        return torch.randn(n, generator=g) * torch.randn(n, generator=g)
    return torch.exp(torch.randn(n, generator=g) * 2) * torch.sign(torch.randn(n, generator=g))  # log-normal


def run(n: int = 100_000) -> list[dict[str, Any]]:
    fp16 = FORMATS["fp16"]
    rows = []
    for kind in ("normal", "product of two normals", "log-normal (sigma 2)"):
        for exponent in (-20, -22, -24, -26):
            g = torch.Generator().manual_seed(0)
            x = _draw(kind, n, g) * 2.0**exponent
            true = ((x != 0) & (x.half() == 0)).sum().item() / max((x != 0).sum().item(), 1)
            row = torch.zeros(_TABLES.width, dtype=torch.int64)
            add_histogram(x.half(), row, _TABLES)
            values = row.numpy()[None]
            tensor = tensor_figures(values[:, :-1], values[:, -1], _LAYOUT)
            f = format_figures(_LAYOUT.tails(values[:, :-1]), tensor, _LAYOUT, fp16)
            estimate, basis = flushed_share(int(f.flushed_count[0]), int(f.at_min_subnormal[0]),
                                            int(tensor.zeros[0]), int(tensor.nonzero[0]))
            rows.append({"distribution": kind, "scale_log2": exponent, "true": true, "estimate": estimate,
                         "basis": basis})
    return rows
