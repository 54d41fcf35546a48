"""The fraction of saturated sigmoid / tanh outputs, reduced on the device on sampled steps.

A unit is saturated when its pre-activation is beyond +-5 (DeepDiagnosis's bound): a sigmoid
output within sigmoid(-5) = 0.0067 of 0 or 1, a tanh output beyond tanh(5) = 0.99991 in
magnitude. There the local derivative is below 0.007, so almost no gradient passes.

On a sampled step each output is only recorded (``batch.BatchedFractions``); the fractions are
reduced together, a few ops per group of same-sized outputs, at the end of the model's forward
(this probe's own hook on the root, run even when the forward raises), before backward, before
the update and when the row closes, so no output is held past the forward that made it (the
outputs of modules the loop calls itself: past its backward). Entries recorded for a row that
was abandoned (a fault raised mid-step) are dropped, not written into the next. No host read.
Under torch.compile the reduction is traced into the graph instead, one output at a time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, Optional

import torch
from torch import nn

from .batch import BatchedFractions, fraction
from .cadence import sampled
from .compat import is_compiling as _is_compiling
from .hookset import ModuleHook
from .probe import Probe, ProbeHost
from .records import StepMeta

__all__ = ["SaturationWatch"]

logger = logging.getLogger("torch_sentinel")


_SIGMOID_EDGE = 0.5 - 1.0 / (1.0 + math.exp(5.0))  # |sigmoid(x) - 0.5| beyond this: |x| > 5
_TANH_EDGE = math.tanh(5.0)


class SaturationWatch(Probe):
    name = "saturation"

    def __init__(self, first: int = 5, every: int = 10) -> None:
        self.first = first
        self.every = every
        self.sites: list[str] = []
        self._slot: dict[int, int] = {}
        self._found: list[nn.Module] = []
        self._pending: Optional[BatchedFractions] = None
        #: The row the pending entries belong to (``host.meta`` when they were recorded).
        self._row: Optional[StepMeta] = None

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        found = [(n, m) for n, m in host.map.modules if isinstance(m, (nn.Sigmoid, nn.Tanh))]
        if not found:
            return
        self.sites = [n for n, _ in found]
        self._found = [m for _, m in found]
        block = host.ledger.add_block("saturation", self.sites)
        for i, (_, m) in enumerate(found):
            self._slot[id(m)] = block.start + i
        self._pending = BatchedFractions(host.ledger)
        # The end of the model's forward, raised or not: the boundary of the recorded outputs.
        host.hooks.add(host.map.root.register_forward_hook(ModuleHook(self._forward_done), always_call=True))

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
        pending = self._pending
        if pending is None:
            return  # switched off
        if self._row is not c.meta:
            pending.drop()  # recorded for a row that was abandoned
            self._row = c.meta
        pending.add(t, self._slot[id(module)], shift, edge)
        c.meta.extra["saturation"] = True

    def _forward_done(self, module: nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        try:
            self._flush()
        except Exception as exc:  # a sentinel bug must not stop training (as in ProbeTable.emit)
            self._pending = None
            logger.warning("torch_sentinel: probe %s failed and is switched off (%s: %s); training goes on",
                           self.name, type(exc).__name__, exc)

    def _flush(self) -> None:
        pending = self._pending
        if pending is None or not len(pending):
            return
        if self._row is self.host.meta:
            pending.flush()
        else:
            pending.drop()  # the row they were recorded for was abandoned

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._flush()  # outputs of modules the loop called itself, before this forward

    def on_backward(self, loss: torch.Tensor) -> None:
        self._flush()

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._flush()

    def on_row_close(self, meta: StepMeta) -> None:
        self._flush()
        if self.host.traced and self.sites:
            meta.extra["saturation"] = True

    def close(self) -> None:
        if self._pending is not None:
            self._pending.drop()
