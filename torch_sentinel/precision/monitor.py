"""Host side: histograms in, one row of figures per tensor, format and sampled step out.

:class:`PrecisionMonitor` takes the probe's samples as they reach the host, derives the
figures of every watched format (``derive.py``), follows each tensor's ``amax`` over the
sampled steps (``trend.py``) and hands out :class:`PrecisionRow` s, which the probe publishes
(``PrecisionRows``) for the detectors (``precision_overflow``, ``precision_underflow``),
TensorBoard and ``precision.jsonl``. Plain host code: no torch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from .derive import finite_or_none, flushed_share, format_figures, tensor_figures
from .formats import FORMATS
from .layout import BinLayout, float32_from_bits
from .trend import AmaxTrend

__all__ = ["ROW_FIELDS", "PrecisionMonitor", "PrecisionRow", "Sample", "TensorRow"]

#: The fields of a row as written to ``precision.jsonl`` and printed by ``torch-sentinel precision --json``.
ROW_FIELDS = ("module", "tensor", "format", "step", "flushed", "subnormal", "saturated", "amax",
              "amin_nonzero", "headroom_bits", "steps_to_overflow")


@dataclasses.dataclass(frozen=True)
class TensorRow:
    """What one row of the probe's device buffer holds."""

    module: str
    #: ``"activation"`` or ``"gradient"``.
    tensor: str


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sampled step's histograms, on the host."""

    step: int
    #: ``(rows, bins)`` element counts.
    counts: np.ndarray
    #: ``(rows,)`` float32 bit patterns of each row's largest magnitude.
    amax_bits: np.ndarray
    #: The gradient rows were multiplied by a GradScaler's scale.
    scaled: bool
    #: Histograms were taken (False: an ``amax`` sample, ``counts`` all zero, for the trend).
    full: bool = True


@dataclasses.dataclass(frozen=True)
class PrecisionRow:
    """One tensor in one format at one sampled step (fractions are of the tensor's elements)."""

    module: str
    #: ``"activation"`` (the module's output) or ``"gradient"`` (its own parameters' gradients).
    tensor: str
    format: str
    step: int
    flushed: float
    subnormal: float
    saturated: float
    amax: Optional[float]
    amin_nonzero: Optional[float]
    headroom_bits: Optional[float]
    #: Steps until ``amax`` is predicted to pass the format's overflow edge (0: already
    #: past it), None when it is not growing.
    steps_to_overflow: Optional[int]
    #: The standard error of that prediction, in steps (see ``trend.Crossing``).
    overflow_error: Optional[float] = None
    #: The steps the ``amax`` trend was fitted over (``trend.Crossing.span``).
    trend_span: Optional[int] = None
    #: Whether ``format`` is the one the run computes in (bf16/fp16 weights or autocast).
    compute: bool = False
    #: The share of the nonzero values that flush, and how it is known (``derive.flushed_share``).
    flushed_share: float = 0.0
    flushed_basis: str = "cast"
    #: The gradients were measured times a GradScaler's scale (as backward computed them).
    scaled: bool = False

    @property
    def predicted_overflow_step(self) -> Optional[int]:
        return None if self.steps_to_overflow is None else self.step + self.steps_to_overflow

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ROW_FIELDS}


class PrecisionMonitor:
    """Derives rows from samples; keeps each tensor's ``amax`` trend.

    Args:
        layout: the bins the samples were counted in.
        rows: what each histogram row holds.
        window: sampled steps in each ``amax`` fit.
    """

    def __init__(self, layout: BinLayout, rows: list[TensorRow], window: int = 8) -> None:
        self.layout = layout
        self.rows = rows
        self.window = window
        self._trends: dict[int, AmaxTrend] = {}

    def derive(self, sample: Sample, formats: tuple[str, ...], compute_format: Optional[str]) -> list[PrecisionRow]:
        """The rows of one sample in each of ``formats``; ``compute_format`` is the format the
        run computes in (None: float32), for the underflow share and the rows' ``compute``.
        An ``amax`` sample (``full`` false) only extends the trends: no rows."""
        if not sample.full:
            self._extend_trends(sample)
            return []
        layout = self.layout
        tensor = tensor_figures(sample.counts, sample.amax_bits, layout)
        tails = layout.tails(np.asarray(sample.counts, dtype=np.int64))
        figures = {name: format_figures(tails, tensor, layout, FORMATS[name]) for name in formats}
        limits = {name: math.log2(FORMATS[name].edges["overflow"].value) for name in formats}
        present = np.flatnonzero(tensor.numel > 0).tolist()  # rows of modules that ran, tensors that were there
        amaxes = tensor.amax.tolist()
        out = []
        for i in present:
            what = self.rows[i]
            scaled = sample.scaled and what.tensor == "gradient"
            amax = amaxes[i]
            trend = self._trends.setdefault(i, AmaxTrend(self.window))
            if not scaled and tensor.nonfinite[i] == 0:
                # A GradScaler moves the scale by factors of 2 on its own, and overflow of
                # scaled gradients is its business (it skips the step): no trend there.
                trend.add(sample.step, amax)
            line = None if scaled else trend.fit()
            for name, fig in figures.items():
                ahead: Optional[int] = None
                error: Optional[float] = None
                span: Optional[int] = None
                if scaled:
                    pass  # the scaler's business (see above)
                elif fig.saturated[i] > 0:
                    ahead, error = 0, 0.0
                elif line is not None:  # not past the edge yet: the next step at the earliest
                    crossing = line.crossing(limits[name])
                    ahead = max(1, math.ceil(crossing.step) - sample.step)
                    error, span = crossing.error, crossing.span
                compute = name == compute_format
                share, basis = 0.0, "cast"
                if compute:  # what precision_underflow reads
                    share, basis = flushed_share(int(fig.flushed_count[i]), int(fig.at_min_subnormal[i]),
                                                 int(tensor.zeros[i]), int(tensor.nonzero[i]))
                out.append(PrecisionRow(
                    module=what.module, tensor=what.tensor, format=name, step=sample.step,
                    flushed=float(fig.flushed[i]), subnormal=float(fig.subnormal[i]),
                    saturated=float(fig.saturated[i]), amax=finite_or_none(amax),
                    amin_nonzero=finite_or_none(tensor.amin_nonzero[i]),
                    headroom_bits=finite_or_none(fig.headroom_bits[i]), steps_to_overflow=ahead,
                    overflow_error=error, trend_span=span, compute=compute, flushed_share=share,
                    flushed_basis=basis, scaled=scaled,
                ))
        return out

    def _extend_trends(self, sample: Sample) -> None:
        """An ``amax`` sample into the trends, but scaled gradients' (see :meth:`derive`); the
        trend itself leaves out zero (a tensor not seen) and non-finite values."""
        amax = float32_from_bits(sample.amax_bits)
        for i, value in enumerate(amax.tolist()):
            if not (sample.scaled and self.rows[i].tensor == "gradient"):
                self._trends.setdefault(i, AmaxTrend(self.window)).add(sample.step, value)
