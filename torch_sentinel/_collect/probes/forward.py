"""Forward activations: the largest |x| of every module's output, checked for non-finite values.

Eager steps record the outputs and reduce them in one batch at the end of the forward (see
``batch.py``): the ``act`` pair holds (-|x|max, |x|max). Under torch.compile the reduction is
traced into the graph per module (true min and max).

Value-preserving modules (activations, dropout, pooling, reshapes) are not reduced: a
non-finite value at their output was already non-finite at their input (see ``VALUE_PRESERVING``).
In immediate mode a non-finite output is localised when its batch is reduced, with the output,
the module and its inputs still in hand: non-finite weights of the module (the previous update),
non-finite inputs (functional code of the caller), or the module itself.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..._record import Fact, StepRecord
from ..._record.fault import Fault
from ..cadence import sampled
from ..probe import Probe, ProbeHost
from ..tensors import VALUE_PRESERVING, all_finite, iter_tensors, reducible, tensor_evidence

__all__ = ["Activations", "ForwardProbe"]


@dataclasses.dataclass(frozen=True)
class Activations(Fact):
    """The range of every module's output in the step, as a pair per module: (-|x|max, |x|max)
    on eager steps (true min and max under torch.compile). A module that did not run, or was not
    reduced this step, has ``lo > hi``."""

    modules: Sequence[str]
    lo: np.ndarray
    hi: np.ndarray

    def absmax(self) -> np.ndarray:
        """Largest |output| per module (float64; NaN where the module was not reduced)."""
        lo, hi = self.lo.astype(np.float64), self.hi.astype(np.float64)
        return np.where(hi >= lo, np.maximum(np.abs(lo), np.abs(hi)), np.nan)


class ForwardProbe(Probe):
    name = "forward"
    publishes = (Activations,)

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.lo, self.hi = host.ledger.add_minmax_block("act", list(host.module_names))
        self.checked = [not isinstance(m, VALUE_PRESERVING) for _, m in host.map.modules]
        host.provide(Activations, _activations)

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        # Value-preserving modules are not even called (one Python call less per module).
        return [m for (_, m), checked in zip(host.map.modules, self.checked) if checked]

    def due(self, step: int) -> bool:
        """Every module output on full steps; on the others the root's outputs carry the check
        (a fault there is localised by running the forward again: ``Collector.rerun_forward``)."""
        return sampled(step)

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if not self.checked[slot]:
            return
        host = self.host
        lo, hi = self.lo.start + slot, self.hi.start + slot
        if compiling:
            host.reduce_into(t, lo, hi, True, "forward")
            return
        if slot and not host.fully_watched:
            return  # hooked for another probe on an ordinary step: the root's outputs carry the check
        host.meta.shapes[slot] = (t.shape, t.dtype)  # formatted only when a fault is reported
        # The module and its inputs are held (until the boundary) only where a fault is
        # localised on the spot.
        on_bad = functools.partial(self._fault, slot, module, args) if host.immediate else None
        host.reduce_later(t, lo, hi, "forward", on_bad)

    def _fault(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor) -> None:
        host = self.host
        if host.rerunning:
            located_by = (f"first non-finite module output in forward order when step {host.step}'s forward "
                          f"was run again with every module watched (same inputs, RNG state and weights)")
        elif host.fully_watched:
            located_by = (f"first non-finite module output in forward order among the batched checks of "
                          f"step {host.step}")
        else:
            rerun = host.rerun_forward()
            if rerun == "localised":
                return  # reported from inside the rerun
            located_by = (f"first non-finite output among the modules watched at step {host.step}; " + {
                "root": "running the forward again with every module watched found no submodule output "
                        "non-finite: the model's own forward code made it",
                "clean": "running the forward again with every module watched did not reproduce it "
                         "(a non-deterministic forward?)",
                "failed": "the forward could not be run again to localise it",
            }[rerun])
        name = host.module_names[slot]
        for pname, p in module.named_parameters(recurse=False):
            if not all_finite(p):
                # Finite inputs, non-finite weights: the previous optimizer step made them.
                qual = f"{name}.{pname}" if name else pname
                host.on_fault(Fault.weights(host.step, name, qual, evidence=tensor_evidence(p),
                                            located_by=located_by))
                return
        inputs_finite = all(all_finite(a) for a in iter_tensors(args) if reducible(a))
        # Non-finite inputs went bad in functional code between submodules: blame the caller,
        # and name the caller's type (not the child's) next to the caller's name.
        caller = name.rpartition(".")[0] if name else name
        host.on_fault(Fault.forward(host.step, name, tensor_evidence(t), type(module).__name__,
                                    caller=None if inputs_finite else (caller, host.map.type_of(caller)),
                                    inputs_finite=inputs_finite, located_by=located_by))


def _activations(record: StepRecord) -> Optional[Activations]:
    if not record.has("act.min"):
        return None
    return Activations(record.keys("act.min"), record.array("act.min"), record.array("act.max"))
