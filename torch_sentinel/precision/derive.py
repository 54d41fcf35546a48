"""Host side: every figure of a tensor in a format, from its histogram row (numpy, no torch).

All fractions are of the tensor's elements (zeros and non-finite ones included):

- ``flushed``: nonzero finite values that round to 0 in the format;
- ``subnormal``: values that round to a nonzero subnormal of the format;
- ``saturated``: finite values whose magnitude rounds above the format's largest finite value
  (to inf, or, for e4m3, clamped to 448 by the cast);
- ``headroom_bits``: ``log2(max_finite / amax)``, negative once ``amax`` is past the max.

They are exact counts, since the histogram is cut at each format's rounding edges
(``layout.py``). ``amax`` is exact when the tensor is finite (its bit pattern is reduced on
the device); with non-finite values present it is the lower edge of the highest finite bin.
``amin_nonzero`` is the lower edge of the lowest nonzero bin: a binade (or a rounding edge)
below the true value, never above it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from .formats import Format
from .layout import BinLayout, float32_from_bits

__all__ = ["FormatFigures", "TensorFigures", "flushed_share", "format_figures", "tensor_figures"]

_INF_BITS = 0x7F800000


@dataclasses.dataclass(frozen=True)
class TensorFigures:
    """Format-independent figures, one entry per histogram row."""

    numel: np.ndarray
    zeros: np.ndarray
    nonfinite: np.ndarray
    #: Nonzero finite elements.
    nonzero: np.ndarray
    #: The largest finite magnitude (0 for an all-zero row, nan for a row without finite values).
    amax: np.ndarray
    #: The lower edge of the lowest nonzero bin (nan when there is none).
    amin_nonzero: np.ndarray


@dataclasses.dataclass(frozen=True)
class FormatFigures:
    """Figures of each row in one format: fractions of ``numel`` and counts."""

    flushed: np.ndarray
    subnormal: np.ndarray
    saturated: np.ndarray
    headroom_bits: np.ndarray
    flushed_count: np.ndarray
    #: Elements that round to the format's smallest subnormal: the evidence of a flush that
    #: already happened (see :func:`flushed_share`).
    at_min_subnormal: np.ndarray


def tensor_figures(counts: np.ndarray, amax_bits: np.ndarray, layout: BinLayout) -> TensorFigures:
    """Figures of each row of ``counts`` (``(rows, bins)``) with its largest magnitude's bits.

    Args:
        counts: element counts per bin.
        amax_bits: the float32 bit pattern of each row's largest magnitude (device reduced).
        layout: the bins ``counts`` was made with.
    """
    counts = np.asarray(counts, dtype=np.int64)
    numel = counts.sum(axis=1)
    nonfinite = counts[:, -1]
    zeros = counts[:, 0]
    nonzero = numel - zeros - nonfinite
    edges = layout.lower_edges()
    occupied = counts[:, 1:-1] > 0  # nonzero finite bins
    any_finite = occupied.any(axis=1)
    lowest = np.where(any_finite, occupied.argmax(axis=1) + 1, 0)
    highest = np.where(any_finite, occupied.shape[1] - occupied[:, ::-1].argmax(axis=1), 0)
    amin = np.where(any_finite, edges[lowest], np.nan)
    bits = np.asarray(amax_bits, dtype=np.int64)
    exact = float32_from_bits(np.minimum(bits, _INF_BITS - 1))
    amax = np.where(bits < _INF_BITS, exact, edges[highest])
    amax = np.where(any_finite | (zeros > 0), np.where(any_finite, amax, 0.0), np.nan)
    return TensorFigures(numel, zeros, nonfinite, nonzero, amax, amin)


def format_figures(tails: np.ndarray, tensor: TensorFigures, layout: BinLayout, fmt: Format) -> FormatFigures:
    """Figures of each row in ``fmt``.

    Args:
        tails: ``layout.tails(counts)`` of the rows' element counts per bin.
        tensor: :func:`tensor_figures` of the same rows.
        layout: the bins.
        fmt: the format.
    """
    names = ["nonzero", f"{fmt.name}.flush", f"{fmt.name}.min_subnormal_up", f"{fmt.name}.normal",
             f"{fmt.name}.overflow", "nonfinite"]
    nonzero, flush, min_up, normal, overflow, nonfinite = layout.above(tails, names).T
    numel = np.maximum(tensor.numel, 1)
    flushed = nonzero - flush
    positive = tensor.amax > 0  # (np.errstate would do, at ~0.2 ms a call)
    headroom = np.full(tensor.amax.shape, np.nan)
    headroom[positive] = np.log2(fmt.max_finite / tensor.amax[positive])
    return FormatFigures(
        flushed=flushed / numel,
        subnormal=(flush - normal) / numel,
        saturated=(overflow - nonfinite) / numel,
        headroom_bits=headroom,
        flushed_count=flushed,
        at_min_subnormal=flush - min_up,
    )


def flushed_share(flushed: int, at_min_subnormal: int, zeros: int, nonzero: int) -> tuple[float, str]:
    """The share of a tensor's nonzero values that flush to zero in a format, and its basis.

    ``"cast"``: the tensor holds values finer than the format (float32 activations that an fp16
    op will take in), and the cast flushes ``flushed`` of them: exact.

    ``"extrapolated"``: nothing in the tensor would flush, yet values sit at the format's
    smallest subnormal ``q``: the tensor was already rounded to the format (an fp16 gradient,
    or an fp32 gradient under autocast, computed in fp16), and whatever fell below ``q/2``
    is now among its zeros. With a density that is flat near zero (gradients are sums of many
    terms), the values that rounded to 0 from ``(0, q/2]`` number half of those that rounded to
    ``q`` from ``(q/2, 3q/2)``; at most the tensor's zeros. Nonzero values then include them.

    Args:
        flushed: nonzero values the cast would flush (:class:`FormatFigures` ``flushed_count``).
        at_min_subnormal: values that round to the smallest subnormal.
        zeros: the tensor's zeros.
        nonzero: its nonzero finite values.
    """
    if flushed > 0:
        return flushed / max(nonzero, 1), "cast"
    lost = min(float(zeros), at_min_subnormal / 2.0)
    total = nonzero + lost
    return (lost / total if total > 0 else 0.0), "extrapolated"


def finite_or_none(value: float) -> Optional[float]:
    """A plain float for JSON, None for nan and inf."""
    value = float(value)
    return value if math.isfinite(value) else None
