"""The exact reference for the precision figures: torch's own cast, ``x.to(dtype)``, and what
the tests share (a sink that keeps the rows, the histogram of one tensor)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch

from torch_sentinel import StepRecord
from torch_sentinel.precision.derive import TensorFigures, format_figures, tensor_figures
from torch_sentinel.precision.formats import Format
from torch_sentinel.precision.histogram import DeviceTables, add_histogram
from torch_sentinel.precision.layout import BinLayout
from torch_sentinel.precision.monitor import PrecisionRow
from torch_sentinel.precision.probe import PrecisionRows

LAYOUT = BinLayout.default()
TABLES = DeviceTables(LAYOUT, torch.device("cpu"))


def cast_fractions(x: torch.Tensor, fmt: Format) -> tuple[float, float, float]:
    """(flushed, subnormal, saturated) of ``x`` in ``fmt``, counted on ``x.to(fmt.dtype)``.

    e4m3fn has no inf: torch's cast clamps every magnitude above 448 to 448, so a saturated
    value is told from a rounded one by its distance: rounded to nearest-even with 3 fraction
    bits it would be 480 or more (``round_to_bits``), i.e. beyond the largest finite value.
    """
    x32 = x.float()
    cast = x32.to(fmt.dtype).float()
    finite = torch.isfinite(x32)
    n = x32.numel()
    flushed = ((x32 != 0) & finite & (cast == 0)).sum().item() / n
    subnormal = (finite & (cast != 0) & (cast.abs() < fmt.min_normal)).sum().item() / n
    if fmt.saturating:
        beyond = finite & (round_to_bits(x32.double().abs(), fmt.mantissa_bits) > fmt.max_finite)
        assert bool((cast.abs()[beyond] == fmt.max_finite).all()), "torch's e4m3fn cast no longer clamps"
        saturated = beyond.sum().item() / n
    else:
        saturated = (finite & ~torch.isfinite(cast)).sum().item() / n
    return flushed, subnormal, saturated


def round_to_bits(a: torch.Tensor, bits: int) -> torch.Tensor:
    """``a`` (float64, >= 0, normal range) rounded to nearest-even with ``bits`` fraction bits."""
    m, e = torch.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    scaled = m * 2.0 ** (bits + 1)
    return torch.round(scaled) * torch.pow(2.0, (e - bits - 1).double())  # torch.round: half to even


def histogram(x: torch.Tensor, scale: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """One tensor's histogram row: ``(counts (1, bins), amax bits (1,))``."""
    row = torch.zeros(TABLES.width, dtype=torch.int64)
    add_histogram(x, row, TABLES, scale)
    values = row.numpy()[None]
    return values[:, :-1], values[:, -1]


def figures(x: torch.Tensor, fmt: Format) -> tuple[TensorFigures, tuple[float, float, float]]:
    counts, amax = histogram(x)
    tensor = tensor_figures(counts, amax, LAYOUT)
    f = format_figures(LAYOUT.tails(counts), tensor, LAYOUT, fmt)
    return tensor, (float(f.flushed[0]), float(f.subnormal[0]), float(f.saturated[0]))


class RowSink:
    """A sink that keeps every precision row the records carry (``Sentinel.add_sink``), and
    what the last fact said of the formats."""

    def __init__(self) -> None:
        self.rows: list[PrecisionRow] = []
        self.formats: tuple[str, ...] = ()
        self.compute_format: Optional[str] = None
        self.facts = 0

    def write(self, records: Sequence[StepRecord], findings: Sequence[Any]) -> None:
        for record in records:
            fact = record.fact(PrecisionRows)
            if fact is not None:
                self.rows.extend(fact.rows)
                self.formats, self.compute_format = fact.formats, fact.compute_format
                self.facts += 1

    def close(self) -> None:
        pass

    def of(self, module: str, tensor: str, fmt: str) -> list[PrecisionRow]:
        return [r for r in self.rows if (r.module, r.tensor, r.format) == (module, tensor, fmt)]
