"""The step in progress, and the root call in progress: everything that lives exactly that long.

A step opens when the previous one closes (or at attach) and holds its host facts and the
collector's bookkeeping for it; when the step closes, or is abandoned, the collector replaces
the whole object, so nothing is reset by hand. The same for one call of the model's forward: a
:class:`RootCall` is created at the root's forward pre-hook and dropped at its exit, and with it
every reference it held (the call's inputs, its last output): no activation outlives its call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from .._record import StepMeta
from .rerun import RngState

__all__ = ["OpenStep", "RootCall"]


@dataclasses.dataclass(eq=False)
class OpenStep:
    """One optimizer step from its opening to its close (its row is the ledger's current row)."""

    meta: StepMeta
    #: Slot pairs already written in this step (the rest still hold their initial values).
    written: set[int] = dataclasses.field(default_factory=set)
    #: Optimizers (by id) that already stepped in this row.
    stepped: set[int] = dataclasses.field(default_factory=set)

    @property
    def step(self) -> int:
        return self.meta.step


@dataclasses.dataclass(eq=False)
class RootCall:
    """One training call of the attached model's forward, from its pre-hook to its exit."""

    #: Grad was enabled at the call (a training forward).
    training: bool
    #: id() of the exception being handled when the call began (a retry inside an ``except``):
    #: at the exit, another one means this forward raised.
    handling: int = 0
    #: Inside the root's own forward (host bookkeeping; not while tracing under torch.compile).
    in_root: bool = False
    #: What a rerun needs if the outputs go bad: the call's (args, kwargs, RNG state), held on
    #: steps not fully watched, until the call ends.
    replay: Optional[tuple[tuple[Any, ...], dict[str, Any], RngState]] = None
    #: The output most recently seen in this call: a container (or Identity) returning it as
    #: is must not deliver it, or hook its gradient, a second time.
    last_output: Optional[torch.Tensor] = None
