"""Output gradients: min and max of the gradient arriving at each watched module output.

The collector registers the gradient hooks (see ``Collector._watch_gradient``) for the outputs
this probe asks for (:meth:`OutputGradProbe.watching`), and the order in which backward reaches
them (``meta.bwd_order``) localises a non-finite gradient to the module whose backward made it.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..faults import Fault
from ..probe import Probe, ProbeHost
from ..tensors import STANDARD_LAYERS, tensor_evidence

__all__ = ["OutputGradProbe"]


class OutputGradProbe(Probe):
    name = "outgrad"

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.lo, self.hi = host.ledger.add_minmax_block("outgrad", list(host.module_names))
        modules = [m for _, m in host.map.modules]
        self._standard = [isinstance(m, STANDARD_LAYERS) for m in modules]
        self._is_leaf = [next(iter(m.children()), None) is None for m in modules]
        #: Whether each module's output gradient is reduced outside the steps that watch all.
        self.watch = [True] * len(modules)

    @staticmethod
    def watch_all_due(step: int) -> bool:
        """Every output gradient is reduced on the first ten steps and every tenth after: the
        gradient-scale detectors compare the signal across all layers on those steps."""
        return step < 10 or step % 10 == 0

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
        lo = self.lo.start + slot
        hi = self.hi.start + slot
        host.reduce_into(grad, lo, hi, probe="outgrad")
        order = host.meta.bwd_order
        previous = order[-1] if order else None
        order.append(slot)
        if host.immediate and not host.meta.amp and not (host.finite(lo) and host.finite(hi)):
            names = host.module_names
            culprit: Optional[str] = None
            if previous is None:
                detail = {"incoming_to": names[slot], "source": "loss backward"}
            else:
                culprit = names[previous]
                detail = {"incoming_to": names[slot], "source": "module backward"}
            host.on_fault(Fault(host.step, "gradients", culprit, tensor_evidence(grad), detail))
