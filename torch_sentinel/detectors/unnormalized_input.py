"""``unnormalized_input``: inputs far from zero mean and unit scale, or constant features.

Thresholds:
- ``unnormalized_input.scale`` = 10: reported when max(|mean|, std) of the input, as a median
  over sampled steps, exceeds 10 (raw 0..255 pixels give ~100). UMLAUT flags anything outside
  [-1, 1], but standardized data routinely reaches +-4, so we allow an order of magnitude.
- ``unnormalized_input.tiny`` = 1e-2: reported when every |x| stays below 0.01 (pixels divided
  by 255 twice): the first layer's activations then sit at initialisation noise.
- ``unnormalized_input.min_steps`` = 3 sampled steps (steps 0-4, then every 10th).
A model whose first layer is a normalization layer (BatchNorm, LayerNorm) normalises its own
inputs, so the scale check is skipped there; constant features are still reported.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np

from .._collect.inputs import InputMoments, InputStats
from .._collect.probe import Probe
from .._collect.probes.data import InputRange
from .._collect.transfer import AsyncFetch
from .._findings import Finding
from .._record import StepRecord
from ._robust import median
from .base import Detector, Threshold

__all__ = ["UnnormalizedInputDetector"]

_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "InstanceNorm1d",
          "InstanceNorm2d", "InstanceNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d")


class UnnormalizedInputDetector(Detector):
    """Reads the input moments of sampled steps, and owns the probe whose per-feature mask
    (kept on the device over a window) says which features never varied."""

    kind = "unnormalized_input"
    rung = "data"
    next_check = "normalize_inputs"
    hypothesis = "inputs are not scaled to the range the initialisation assumes"
    reads = (InputMoments, InputRange)
    thresholds = {
        "scale": Threshold(10.0, "UMLAUT flags inputs outside [-1, 1]; standardized data reaches +-4, "
                                 "so an order of magnitude more (raw 0..255 pixels give ~100)"),
        "tiny": Threshold(1e-2, "every |x| below 0.01: pixels divided by 255 twice"),
        "min_steps": Threshold(3, "sampled steps (0-4, then every 10th), median"),
    }
    #: A device copy in flight.
    live_attributes = frozenset({"_fetch", "_all_varied"})

    def __init__(self) -> None:
        self.stats = InputStats()

    def setup(self) -> None:
        self.scale = self.threshold("scale")
        self.tiny = self.threshold("tiny")
        self.min_steps = int(self.threshold("min_steps"))
        # Bounded: the verdict is a median over the most recent sampled steps.
        self._samples: collections.deque[tuple[int, float, float, float, float]] = collections.deque(maxlen=50)
        self._first_sampled: Optional[int] = None
        self._scale_done = False
        self._const_done = False
        #: The mask copy in flight: (sampled steps, step, the mask's generation, the copy).
        self._fetch: Optional[tuple[int, int, int, AsyncFetch]] = None
        self._last_step = 0
        #: The mask (its generation) in which every feature has varied: final while it lasts
        #: (the mask only accumulates), so it is not fetched again every window.
        self._all_varied: Optional[int] = None

    def probes(self) -> Sequence[Probe]:
        return (self.stats,)

    def _first_is_norm(self) -> bool:
        for slot in self.ctx.forward_order():
            name = self.ctx.module_names[slot]
            mtype = self.ctx.module_types.get(name, "")
            if name == "" or mtype in ("Sequential", "ModuleList", "ModuleDict"):
                continue
            return mtype in _NORMS
        return False

    def update(self, record: StepRecord) -> None:
        self._last_step = record.step
        moments, seen = record.fact(InputMoments), record.fact(InputRange)
        if moments is None or seen is None:
            return
        if len(self._samples) == self.min_steps - 1:
            self._first_sampled = record.step
        self._samples.append((record.step, moments.mean, moments.std, *seen.inputs))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        return _one(self._scale_finding(), self._constant_finding(block=final))

    def _scale_finding(self) -> list[Finding]:
        if self._scale_done or len(self._samples) < self.min_steps:
            return []
        s = np.array([x[1:] for x in self._samples], dtype=np.float64)
        if not np.isfinite(s).all():
            return []
        mean, std = median(s[:, 0]), median(s[:, 1])
        lo, hi = float(s[:, 2].min()), float(s[:, 3].max())
        big = max(abs(mean), std)
        peak = max(abs(lo), abs(hi))
        if big > self.scale and not self._first_is_norm():
            problem = (f"inputs have mean {mean:.4g} and std {std:.4g} (range {lo:.4g}..{hi:.4g}); "
                       "the layers' initialisation assumes roughly zero mean and unit scale")
        elif 0 < peak < self.tiny:
            problem = (f"every input value is below {self.tiny:g} in magnitude (range "
                       f"{lo:.3g}..{hi:.3g}): the inputs look scaled down twice")
        else:
            return []
        self._scale_done = True
        return [self.finding(
            problem, step=self._first_sampled if self._first_sampled is not None else self._last_step,
            severity="warning",
            evidence={"mean": mean, "std": std, "min": lo, "max": hi,
                      "steps_sampled": len(self._samples), "scale_threshold": self.scale},
        )]

    def _constant_finding(self, block: bool) -> list[Finding]:
        if self._const_done:
            return []
        if self._fetch is None:
            if self._all_varied == self.stats.mask_generation:
                return []
            snap = self.stats.snapshot(self.min_steps)
            if snap is None:
                return []
            self._fetch = (snap[0], self._last_step, self.stats.mask_generation, snap[1])
        steps, at, generation, fetch = self._fetch
        result = fetch.result(block=block)
        if result is None:
            return []
        self._fetch = None
        varied = result[0].astype(bool)
        const = np.flatnonzero(~varied)
        if const.size == 0:
            self._all_varied = generation
            return []
        self._const_done = True
        return [self.finding(
            f"{const.size} of {varied.size} input features were constant (std 0) in every one "
            f"of {steps} sampled batches: standardizing them divides by zero, and they carry no "
            "signal",
            step=at, severity="warning",
            evidence={"constant_features": int(const.size), "features": int(varied.size),
                      "first_constant_features": const[:8].tolist(), "steps_sampled": steps},
            next_check="inspect_data_pipeline",
        )]


def _one(scale: list[Finding], constant: list[Finding]) -> list[Finding]:
    """Both problems found at once are one finding: the session keeps one finding per kind and
    place, so a second one of this kind would be dropped."""
    if not (scale and constant):
        return scale + constant
    a, b = scale[0], constant[0]
    return [dataclasses.replace(a, message=f"{a.message}; and {b.message}", evidence={**a.evidence, **b.evidence})]
