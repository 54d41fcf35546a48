"""Output gradients: the largest |x| of the gradient arriving at each watched module output.

The gradients are recorded in their hooks and reduced in one batch when backward returns (see
``batch.py``); the ``outgrad`` pair holds (-|x|max, |x|max).

The collector's forward events register the gradient hooks for the outputs whose gradients
are watched (``watching.GradientWatch``), and the order in which backward reaches them
(``meta.bwd_order``) localises a non-finite gradient to the module whose backward made it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from ..._record import Fact, StepRecord
from ..._record.fault import Fault
from ..probe import Probe, ProbeHost
from ..tensors import tensor_evidence

__all__ = ["OutputGradProbe", "OutputGradients"]


@dataclasses.dataclass(frozen=True)
class OutputGradients(Fact):
    """The range of the gradient arriving at each watched module output in backward, as
    (-|g|max, |g|max) per module (``lo > hi`` where none arrived or it was not reduced)."""

    modules: Sequence[str]
    lo: np.ndarray
    hi: np.ndarray
    #: Module slots in the order backward reached them.
    backward_order: Sequence[int]
    #: Every module output's gradient was reduced in this step (sampled steps); otherwise only
    #: those that feed custom modules, functional code or the loss.
    complete: bool


class OutputGradProbe(Probe):
    name = "outgrad"
    publishes = (OutputGradients,)

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.lo, self.hi = host.ledger.add_minmax_block("outgrad", list(host.module_names))
        host.provide(OutputGradients, _output_gradients)

    def on_output_grad(self, slot: int, grad: torch.Tensor) -> None:
        host = self.host
        order = host.meta.bwd_order
        previous = order[-1] if order else None
        order.append(slot)
        on_bad = functools.partial(self._fault, slot, previous) if host.immediate else None
        host.reduce_later(grad, self.lo.start + slot, self.hi.start + slot, "outgrad", on_bad)

    def _fault(self, slot: int, previous: Optional[int], grad: torch.Tensor) -> None:
        """A batched check found ``grad`` (arriving at ``slot``'s output) non-finite; under AMP
        that is the GradScaler's call (a skipped step), not a fault."""
        host = self.host
        if not host.meta.amp:
            names = host.module_names
            host.on_fault(Fault.output_gradient(
                host.step, names[slot], names[previous] if previous is not None else None, tensor_evidence(grad),
                located_by=f"first non-finite output gradient in backward order among the batched checks of "
                           f"step {host.step}"))


def _output_gradients(record: StepRecord) -> Optional[OutputGradients]:
    if not record.has("outgrad.min"):
        return None
    meta = record.meta
    return OutputGradients(record.keys("outgrad.min"), record.array("outgrad.min"),
                           record.array("outgrad.max"), meta.bwd_order, meta.outgrad_complete)
