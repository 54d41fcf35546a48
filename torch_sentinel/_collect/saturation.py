"""The fraction of saturated sigmoid / tanh outputs, reduced on the device on sampled steps.

A unit is saturated when its pre-activation is beyond +-5 (DeepDiagnosis's bound): a sigmoid
output within sigmoid(-5) = 0.0067 of 0 or 1, a tanh output beyond tanh(5) = 0.99991 in
magnitude. There the local derivative is below 0.007, so almost no gradient passes. One
comparison and one mean per sampled call, written into a ledger slot; no host read.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Optional

import torch
from torch import nn

from .compat import is_compiling as _is_compiling

__all__ = ["SaturationWatch"]


_SIGMOID_EDGE = 0.5 - 1.0 / (1.0 + math.exp(5.0))  # |sigmoid(x) - 0.5| beyond this: |x| > 5
_TANH_EDGE = math.tanh(5.0)


class SaturationWatch:
    def __init__(self, first: int = 5, every: int = 10) -> None:
        self.first = first
        self.every = every
        self.sites: list[str] = []
        self._slot: dict[int, int] = {}
        self._collector: Optional[weakref.ref[Any]] = None

    def install(self, collector: Any) -> None:
        found = [(n, m) for n, m in collector.map.modules if isinstance(m, (nn.Sigmoid, nn.Tanh))]
        if not found:
            return
        self._collector = weakref.ref(collector)
        self.sites = [n for n, _ in found]
        block = collector.ledger.add_block("saturation", self.sites)
        for i, (_, m) in enumerate(found):
            self._slot[id(m)] = block.start + i
            collector.output_taps.setdefault(id(m), []).append(self._on_output)

    def _on_output(self, module: nn.Module, t: torch.Tensor) -> None:
        c = self._collector() if self._collector is not None else None
        if c is None or _is_compiling() or not (c.step < self.first or c.step % self.every == 0):
            return
        with torch.no_grad():
            d = t.detach()
            if isinstance(module, nn.Sigmoid):
                saturated = (d - 0.5).abs() > _SIGMOID_EDGE
            else:
                saturated = d.abs() > _TANH_EDGE
            c.ledger.views[self._slot[id(module)]].copy_(saturated.float().mean())
        c.meta.extra["saturation"] = True
