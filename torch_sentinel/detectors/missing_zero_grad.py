"""``missing_zero_grad``: gradients accumulate across optimizer steps.

The collector measures, at the first ``backward()`` of each step, the norm of the gradients
already present: gradients left over from the previous step. ``zero_grad()`` (either flavour)
makes it 0 or None; accumulating micro-batches *within* a step is never counted, since only
the first backward of a step looks.

With several optimizers over one attached container (a GAN in an ``nn.ModuleDict``), one
optimizer's backward legitimately leaves gradients on the other's parameters until that one
clears them, so the check is made *per optimizer* (:class:`StalePerOptimizer`): between two
steps of an optimizer, were its own gradients ever cleared? At every backward in that interval
its gradients are looked at before the backward adds to them: all None is a clear (a host
fact), otherwise their norm is folded into a running minimum on the device; a minimum of 0 is
a clear with ``set_to_none=False``. An optimizer whose gradients were never cleared between
its steps applies the sum of all its past gradients. Trainable parameters outside every
optimizer switch the check off (their leftovers are ``unregistered_parameter``'s evidence).

Thresholds: ``missing_zero_grad.min_steps`` = 3 consecutive steps carrying non-zero stale
gradients (of the same optimizer).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import torch

from .._collect.probe import Probe, ProbeHost
from .._collect.probes.norms import GradNorms, StaleGradients
from .._collect.tensors import foreach_norms
from .._findings import Finding
from .._record import Fact, StepRecord
from ._common import common_module, trained
from .base import Detector, Threshold

__all__ = ["MissingZeroGradDetector", "StaleByOptimizer", "StalePerOptimizer"]

#: The ledger block: one slot per optimizer, its stale-gradient minimum at its step.
BLOCK = "stale_by_optimizer"
#: Slot value of an optimizer that did not step in the row (or had no earlier step).
NOT_STEPPED = -1.0


@dataclasses.dataclass(frozen=True)
class StaleByOptimizer(Fact):
    """With several optimizers: per optimizer, the smallest norm its gradients had at any
    backward since its previous step (0: they were cleared; ``NOT_STEPPED``: it did not step
    in this row, or had no earlier step)."""

    values: np.ndarray


class StalePerOptimizer(Probe):
    """Per optimizer, the smallest norm its gradients had at any backward since its last step.

    Set up only with two or more optimizers; events are host checks plus, at a backward where
    an optimizer's gradients are present, one ``_foreach_norm`` folded into a device scalar.
    """

    name = "stale_by_optimizer"
    publishes = (StaleByOptimizer,)

    def __init__(self) -> None:
        self.active = False
        self._params: list[list[torch.Tensor]] = []
        self._index: dict[int, int] = {}
        self._min: list[Optional[torch.Tensor]] = []
        self._measured: list[bool] = []
        self._cleared: list[bool] = []
        self._stepped: list[bool] = []
        self._start = 0

    def setup(self, host: ProbeHost) -> None:
        if len(host.optimizers) < 2:
            return
        self.host = host
        self.active = True
        n = len(host.optimizers)
        self._params = [[p for g in o.param_groups for p in g["params"]] for o in host.optimizers]
        self._index = {id(o): i for i, o in enumerate(host.optimizers)}
        self._min = [None] * n
        self._measured = [False] * n
        self._cleared = [False] * n
        self._stepped = [False] * n
        self._start = host.ledger.add_block(BLOCK, [str(i) for i in range(n)], NOT_STEPPED).start
        host.provide(StaleByOptimizer, _stale_by_optimizer)

    def on_backward(self, loss: torch.Tensor) -> None:
        if not self.active:
            return
        for i, params in enumerate(self._params):
            if self._cleared[i] or not self._stepped[i]:
                continue
            grads = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
            if not grads:
                self._cleared[i] = True  # zero_grad(set_to_none=True) or never given one
                continue
            with torch.no_grad():
                norm = torch.linalg.vector_norm(torch.stack([t.to(self.host.device) for t in foreach_norms(grads)]))
                m = self._min[i]
                if m is None or m.device != norm.device:
                    self._min[i] = m = torch.empty_like(norm)
                if self._measured[i]:
                    torch.minimum(m, norm, out=m)
                else:
                    m.copy_(norm)
            self._measured[i] = True

    def on_pre_step(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        i = self._index.get(id(optimizer), -1) if self.active else -1
        if i < 0 or not self._stepped[i]:
            return
        slot = self.host.ledger.views[self._start + i]
        m = self._min[i]
        self.host.mark_in_row(StaleByOptimizer)
        if self._cleared[i] or not self._measured[i] or m is None:
            slot.zero_()  # cleared, or no backward since its last step (an LBFGS closure's run inside step())
        else:
            slot.copy_(m)

    def on_post_step(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        i = self._index.get(id(optimizer), -1) if self.active else -1
        if i < 0:
            return
        self._stepped[i] = True
        self._cleared[i] = False
        self._measured[i] = False

    def close(self) -> None:
        self._min = [None] * len(self._min)
        self._params = []
        self.active = False


def _stale_by_optimizer(record: StepRecord) -> Optional[StaleByOptimizer]:
    if StaleByOptimizer not in record.meta.in_row or BLOCK not in record.blocks:
        return None
    return StaleByOptimizer(record.array(BLOCK).astype(np.float64))


class MissingZeroGradDetector(Detector):
    """Reads the stale-gradient norm of each step's first backward with one optimizer or none,
    and the per-optimizer minimum (:class:`StalePerOptimizer`) with several."""

    kind = "missing_zero_grad"
    rung = "gradients"
    next_check = "clear_gradients_every_step"
    hypothesis = "gradients accumulate across steps because they are never cleared"
    explains = ("exploding_gradient", "diverging", "update_ratio", "plateau")  # the sum of all past gradients
    reads = (StaleGradients, StaleByOptimizer, GradNorms)
    thresholds = {"min_steps": Threshold(3, "consecutive steps carrying non-zero stale gradients: one or "
                                            "two could be a deliberate accumulation across steps")}
    #: Derived from the run at setup.
    live_attributes = frozenset({"_enabled", "_per_optimizer"})

    def setup(self) -> None:
        self.min_steps = int(self.threshold("min_steps"))
        self._run: list[tuple[int, float, float]] = []
        self._runs: dict[int, list[tuple[int, float]]] = {}
        self._reported = False
        # Trainable parameters outside the optimizer are never cleared by its zero_grad(); their
        # leftover gradients are unregistered_parameter's evidence, not a missing zero_grad().
        # Without an optimizer each backward() is a step: a hand-written loop must clear the
        # gradients itself (model.zero_grad()), so the check applies there too.
        self._enabled = self.ctx.trainable <= self.ctx.optimizer_params
        self._per_optimizer = len(self.ctx.optimizer_groups) > 1

    def update(self, record: StepRecord) -> None:
        if not self._enabled or self._reported or not trained(record):
            return
        if self._per_optimizer:
            self._update_per_optimizer(record)
            return
        stale = record.fact(StaleGradients)
        if record.step > 0 and stale is not None and stale.norm > 0 and math.isfinite(stale.norm):
            grads = record.fact(GradNorms)
            total = float(np.sqrt((grads.at_step**2).sum())) if grads is not None else math.nan
            self._run.append((record.step, stale.norm, total))
        elif record.step > 0:
            self._run = []
        if len(self._run) >= self.min_steps:
            self._reported = True
            steps = [r[0] for r in self._run]
            self.flag(self.finding(
                f"gradients from the previous step were still present at the first backward of "
                f"{len(self._run)} consecutive steps (stale norm {self._run[-1][1]:.4g}): "
                "zero_grad() is not called, so each step applies the sum of all past gradients",
                module=None, step=steps[-1], onset_step=steps[0], severity="error",
                evidence={"steps": steps, "stale_grad_norm": [r[1] for r in self._run],
                          "grad_norm_at_step": [r[2] for r in self._run]},
            ))

    def _update_per_optimizer(self, record: StepRecord) -> None:
        stale = record.fact(StaleByOptimizer)
        if stale is None:
            return
        for i, value in enumerate(stale.values.tolist()):
            if value < 0:
                continue  # this optimizer did not step in this row
            run = self._runs.setdefault(i, [])
            if value > 0 and math.isfinite(value):
                run.append((record.step, value))
            else:
                run.clear()
            if len(run) >= self.min_steps:
                self._reported = True
                self.flag(self._per_optimizer_finding(i, run))
                return

    def _per_optimizer_finding(self, i: int, run: list[tuple[int, float]]) -> Finding:
        groups = self.ctx.optimizer_groups
        names = groups[i] if i < len(groups) else []
        kind = self.ctx.optimizer_types[i] if i < len(self.ctx.optimizer_types) else "optimizer"
        owner = common_module(self.ctx.owner(n) for n in names) if names else ""
        where = f"'{owner}'" if owner else "the model"
        steps = [s for s, _ in run]
        return self.finding(
            f"optimizer {i} ({kind} over {len(names)} parameter(s) of {where}) "
            f"stepped {len(run)} times in a row with gradients never cleared since its previous step "
            f"(stale norm {run[-1][1]:.4g}); each of its steps applies the sum of all its past gradients: "
            f"expected a zero_grad() for {where} between its steps (e.g. {owner or 'model'}.zero_grad() or "
            f"optimizers[{i}].zero_grad() before its backward)",
            module=owner or None, step=steps[-1], onset_step=steps[0], severity="error",
            evidence={"optimizer": i, "steps": steps, "stale_grad_norm": [v for _, v in run],
                      "parameters": names[:8]},
        )
