"""Output gradients: the largest |x| of the gradient arriving at each watched module output.

The gradients are recorded in their hooks and reduced in one batch when backward returns (see
``batch.py``); the ``outgrad`` pair holds (-|x|max, |x|max).

The collector registers the gradient hooks (see ``Collector._watch_gradient``) for the outputs
this probe asks for (:meth:`OutputGradProbe.watching`), and the order in which backward reaches
them (``meta.bwd_order``) localises a non-finite gradient to the module whose backward made it.
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
from ..cadence import sampled
from ..probe import Probe, ProbeHost
from ..tensors import STANDARD_LAYERS, tensor_evidence

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
        modules = [m for _, m in host.map.modules]
        self._standard = [isinstance(m, STANDARD_LAYERS) for m in modules]
        self._is_leaf = [next(iter(m.children()), None) is None for m in modules]
        #: Whether each module's output gradient is reduced outside the steps that watch all.
        self.watch = [True] * len(modules)
        host.provide(OutputGradients, _output_gradients)

    @staticmethod
    def watch_all_due(step: int) -> bool:
        """Every output gradient is reduced on sampled steps (``cadence.py``): the
        gradient-scale detectors compare the signal across all layers on those steps."""
        return sampled(step)

    def plan(self, order: list[int]) -> None:
        """Decide, once the execution order is known, which outputs' gradients to reduce.

        The gradient arriving at a module's output is what its consumer's backward produced.
        When both the module and the next leaf module in execution order are standard layers
        (Linear, Conv, norms, value-preserving activations and pools), that backward cannot
        turn finite values into non-finite ones, and the gradient is also seen further down
        (in the next watched output, or the parameters' gradient norms): reducing it would only
        cost bandwidth, on a CNN eleven activation-sized passes of twelve. Outputs that feed
        custom modules, functional code or the loss stay watched, and so do custom modules' own
        outputs, which mark their place in the backward order for localisation.
        """
        leaves = [s for s in order if self._is_leaf[s]]
        for here, after in zip(leaves, leaves[1:]):
            if self._standard[here] and self._standard[after]:
                self.watch[here] = False

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
