"""Forward activations: min and max of every module's output, checked for non-finite values.

Value-preserving modules (activations, dropout, pooling, reshapes) are not reduced: a
non-finite value at their output was already non-finite at their input (see ``VALUE_PRESERVING``).
In immediate mode a non-finite output is localised on the spot: non-finite weights of the module
(the previous update), non-finite inputs (functional code of the caller), or the module itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..faults import Fault, weight_fault
from ..probe import Probe, ProbeHost
from ..tensors import VALUE_PRESERVING, all_finite, iter_tensors, reducible, tensor_evidence

__all__ = ["ForwardProbe"]


class ForwardProbe(Probe):
    name = "forward"

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.lo, self.hi = host.ledger.add_minmax_block("act", list(host.module_names))
        self.checked = [not isinstance(m, VALUE_PRESERVING) for _, m in host.map.modules]

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        return [m for _, m in host.map.modules]

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if not self.checked[slot]:
            return
        host = self.host
        lo, hi = self.lo.start + slot, self.hi.start + slot
        host.reduce_into(t, lo, hi, compiling, "forward")
        if compiling:
            return
        host.meta.shapes[slot] = (t.shape, t.dtype)  # formatted only when a fault is reported
        if host.immediate and not (host.finite(lo) and host.finite(hi)):
            self._fault(slot, module, args, t)

    def _fault(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor) -> None:
        host = self.host
        name = host.module_names[slot]
        for pname, p in module.named_parameters(recurse=False):
            if not all_finite(p):
                # Finite inputs, non-finite weights: the previous optimizer step made them.
                qual = f"{name}.{pname}" if name else pname
                host.on_fault(weight_fault(host.step, name, qual, None, tensor_evidence(p)))
                return
        inputs_finite = True
        for a in iter_tensors(args):
            if reducible(a) and not all_finite(a):
                inputs_finite = False
                break
        detail: dict[str, Any] = {"module_type": type(module).__name__, "inputs_finite": inputs_finite}
        if not inputs_finite:
            # The input went bad in functional code between submodules: blame the caller, and
            # name the caller's type (not the child's) next to the caller's name.
            detail["first_nonfinite_output_of"] = name
            detail["first_nonfinite_output_type"] = detail["module_type"]
            name = name.rpartition(".")[0] if name else name
            detail["module_type"] = host.map.type_of(name)
        host.on_fault(Fault(host.step, "forward", name, tensor_evidence(t), detail))
