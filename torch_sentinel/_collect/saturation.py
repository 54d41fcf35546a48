"""The fraction of saturated sigmoid / tanh outputs, reduced on the device on sampled steps.

A unit is saturated when its pre-activation is beyond +-5 (DeepDiagnosis's bound): a sigmoid
output within sigmoid(-5) = 0.0067 of 0 or 1, a tanh output beyond tanh(5) = 0.99991 in
magnitude. There the local derivative is below 0.007, so almost no gradient passes.

On a sampled step each output is only recorded (``host.fraction_later``); the collector reduces
the fractions together, a few ops per group of same-sized outputs, at its boundaries (the end
of the model's forward, before and after backward, before the update, the row's close), next
to its batched maxima (``batch.BatchedFractions`` beside ``batch.BatchedMax``). The collector
also drops them when the step is abandoned or the forward raised. No host read. Under
torch.compile the reduction is traced into the graph instead, one output at a time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Optional

import numpy as np
import torch
from torch import nn

from .._record import Fact, StepMeta, StepRecord
from .batch import fraction
from .cadence import sampled
from .probe import Probe, ProbeHost

__all__ = ["SaturatedFractions", "SaturationWatch"]

_SIGMOID_EDGE = 0.5 - 1.0 / (1.0 + math.exp(5.0))  # |sigmoid(x) - 0.5| beyond this: |x| > 5
_TANH_EDGE = math.tanh(5.0)


@dataclasses.dataclass(frozen=True)
class SaturatedFractions(Fact):
    """On a sampled step: the fraction of each sigmoid / tanh module's outputs that are
    saturated (pre-activation beyond +-5)."""

    modules: Sequence[str]
    values: np.ndarray


class SaturationWatch(Probe):
    name = "saturation"
    publishes = (SaturatedFractions,)
    #: All set up at attach: the samples are kept by the detector.
    live_attributes: ClassVar[frozenset[str]] = frozenset({"first", "every", "sites", "_slot", "_found"})

    def __init__(self, first: int = 5, every: int = 10) -> None:
        self.first = first
        self.every = every
        self.sites: list[str] = []
        self._slot: dict[int, int] = {}
        self._found: list[nn.Module] = []

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        found = [(n, m) for n, m in host.map.modules if isinstance(m, (nn.Sigmoid, nn.Tanh))]
        if not found:
            return
        self.sites = [n for n, _ in found]
        self._found = [m for _, m in found]
        block = host.ledger.add_block("saturation", self.sites)
        host.provide(SaturatedFractions, _saturated)
        for i, (_, m) in enumerate(found):
            self._slot[id(m)] = block.start + i

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        return self._found

    def due(self, step: int) -> bool:
        return sampled(step, self.first, self.every)

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        c = self.host
        if not (compiling or self.due(c.step)):
            return  # traced, it runs every step inside the compiled graph (fused there)
        shift, edge = (0.5, _SIGMOID_EDGE) if isinstance(module, nn.Sigmoid) else (0.0, _TANH_EDGE)
        if compiling:
            with torch.no_grad():
                c.ledger.views[self._slot[id(module)]].copy_(fraction(t.detach(), shift, edge))
            return
        c.fraction_later(t, self._slot[id(module)], shift, edge)
        c.mark_in_row(SaturatedFractions)

    def on_row_close(self, meta: StepMeta) -> None:
        if self.host.traced and self.sites:
            meta.in_row.add(SaturatedFractions)


def _saturated(record: StepRecord) -> Optional[SaturatedFractions]:
    if SaturatedFractions not in record.meta.in_row or not record.has("saturation"):
        return None
    return SaturatedFractions(record.keys("saturation"), record.array("saturation").astype(np.float64))
