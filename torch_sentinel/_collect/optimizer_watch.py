"""What each optimizer holds, and whether its gradients were cleared before it stepped.

Two host facts, each decided from host bookkeeping only (no device read):

- :class:`HeldParameters`: the watched parameters each optimizer holds, read from its
  ``param_groups`` at every step (a count of the groups' lengths; the names are rebuilt only
  when it changes). Parameters join an optimizer mid-run through ``add_param_group`` (gradual
  unfreezing: Lightning's ``BaseFinetuning.unfreeze_and_add_param_group``); the run context,
  taken at ``attach()``, does not know them. Published on the first step and on every step
  where the membership changed.
- :class:`ClearedBeforeStep`: optimizers whose parameters a ``zero_grad()`` (of the optimizer
  or of a module of the model, any ``set_to_none``) cleared *after* the step's last backward and
  before their ``step()``: the step applies no gradient. Gradients zeroed in place look like
  gradients that are merely 0, so the call itself is the evidence (``_collect/cleared.py``
  observes the same calls for the collector's own bookkeeping).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from torch import nn

from .._record import Fact
from .patches import patch_for
from .probe import Probe, ProbeHost

__all__ = ["ClearedBeforeStep", "HeldParameters", "OptimizerWatch"]


@dataclasses.dataclass(frozen=True)
class HeldParameters(Fact):
    """The names of the watched parameters each optimizer holds now, in optimizer order."""

    groups: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class ClearedBeforeStep(Fact):
    """Optimizers (indices) that stepped on gradients a ``zero_grad()`` cleared after the last
    backward of the step."""

    optimizers: tuple[int, ...]


class _ZeroGradSeen:
    """Forwards ``zero_grad()`` calls to the probe (held weakly by the patch, see HookSet)."""

    def __init__(self, probe: OptimizerWatch) -> None:
        self._probe = probe

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        if args:
            self._probe.on_zero_grad(args[0])


class OptimizerWatch(Probe):
    name = "optimizer_watch"
    publishes = (HeldParameters, ClearedBeforeStep)

    def __init__(self) -> None:
        self._host: Optional[ProbeHost] = None
        self._sizes: tuple[int, ...] = ()
        #: ids of parameters whose gradients a zero_grad() cleared since the last backward
        self._cleared: set[int] = set()
        self._cleared_optimizers: list[int] = []

    def setup(self, host: ProbeHost) -> None:
        self._host = host
        self._names = {id(p): n for n, p in host.params}
        listener = _ZeroGradSeen(self)
        host.hooks.subscribe(patch_for(nn.Module, "zero_grad"), listener)
        host.hooks.subscribe(patch_for(torch.optim.Optimizer, "zero_grad"), listener)

    def on_zero_grad(self, owner: Any) -> None:
        host = self._host
        if host is None or not host.meta.backward_calls:
            return  # no backward in this step yet: the usual clear before the forward
        if isinstance(owner, nn.Module):
            if host.map.name_of(owner) is None:
                return
            self._cleared.update(id(p) for p in owner.parameters())
        elif any(owner is o for o in host.optimizers):
            self._cleared.update(id(p) for g in owner.param_groups for p in g["params"])

    def on_backward(self, loss: torch.Tensor) -> None:
        self._cleared = set()  # a new backward brings new gradients

    def on_pre_step(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        host = self._host
        if host is None or optimizer is None:
            return
        self._publish_held(host)
        if not self._cleared:
            return
        held = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if held and all(id(p) in self._cleared for p in held):
            index = next(i for i, o in enumerate(host.optimizers) if o is optimizer)
            self._cleared_optimizers.append(index)
            host.publish(ClearedBeforeStep(tuple(self._cleared_optimizers)))

    def on_row_closed(self, step: int) -> None:
        self._cleared = set()
        self._cleared_optimizers = []

    def _publish_held(self, host: ProbeHost) -> None:
        sizes = tuple(sum(len(g["params"]) for g in o.param_groups) for o in host.optimizers)
        if sizes == self._sizes:
            return
        self._sizes = sizes
        names = self._names
        host.publish(HeldParameters(tuple(
            tuple(names[id(p)] for g in o.param_groups for p in g["params"] if id(p) in names)
            for o in host.optimizers)))

    def close(self) -> None:
        self._host = None
        self._cleared = set()
