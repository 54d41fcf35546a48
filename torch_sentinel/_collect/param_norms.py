"""Parameter norms *before* the optimizer step, on sampled pairs of consecutive steps.

The core ledger has norms after each step; comparing the norm before step k with the norm
before step k-1 tells whether step k-1 moved the weights at all, including when the update was
undone between steps (weights restored from a copy, a state_dict reloaded). One
``_foreach_norm`` on the sampled steps; no host read.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

__all__ = ["PreStepNorms", "sampled"]


def sampled(step: int) -> bool:
    """Every step for the first 10, then pairs (10k, 10k+1): enough consecutive pairs to see a
    persistent standstill at a fifth of the cost."""
    return step < 10 or step % 10 in (0, 1)


class PreStepNorms:
    def __init__(self) -> None:
        self._collector: Optional[weakref.ref[Any]] = None
        self._row = -1

    @classmethod
    def shared(cls, extras: dict[str, Any], collector: Any) -> PreStepNorms:
        inst = extras.get("pre_step_norms")
        if inst is None:
            inst = extras["pre_step_norms"] = cls()
            inst.install(collector)
        return inst

    def install(self, collector: Any) -> None:
        self._collector = weakref.ref(collector)
        collector.ledger.add_block("param_norm_pre", [n for n, _ in collector.params])
        collector.step_taps.append(self._on_pre_step)

    def _on_pre_step(self, c: Any) -> None:
        if self._row == c.step or not sampled(c.step):
            return  # with several optimizers, the first pre-step sees the weights before any
        self._row = c.step
        tensors: list[Optional[torch.Tensor]] = [p.detach() for p in c.param_tensors]
        if not tensors:
            return
        block = c.ledger.blocks["param_norm_pre"]
        # The collector's own norm routine: one _foreach_norm, sharded (FSDP2) parameters
        # reduced over their mesh, float32 overflow confirmed.
        c._copy_norms(block.start, len(tensors), tensors)
        c.meta.extra["pre_norms"] = True
