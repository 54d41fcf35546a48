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

import math
from collections.abc import Iterable, Sequence
from typing import ClassVar, Optional

import torch

from .._collect.probe import Probe, ProbeHost
from .._collect.records import StepRecord
from .._collect.tensors import foreach_norms
from .._findings import Finding
from ._common import common_module, threshold, trained_rows
from .base import Detector, RunContext

__all__ = ["MissingZeroGradDetector", "StalePerOptimizer"]

#: The ledger block: one slot per optimizer, its stale-gradient minimum at its step.
BLOCK = "stale_by_optimizer"
#: Slot value of an optimizer that did not step in the row (or had no earlier step).
NOT_STEPPED = -1.0


class StalePerOptimizer(Probe):
    """Per optimizer, the smallest norm its gradients had at any backward since its last step.

    Set up only with two or more optimizers; events are host checks plus, at a backward where
    an optimizer's gradients are present, one ``_foreach_norm`` folded into a device scalar.
    """

    name = "stale_by_optimizer"
    #: Set up at attach; the per-optimizer flags between steps are state.
    live_attributes: ClassVar[frozenset[str]] = frozenset({"active", "_params", "_index", "_min", "_start"})

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


class MissingZeroGradDetector(Detector):
    """Reads ``misc.stale_grad_norm`` (``NormsProbe``) with one optimizer or none, and the
    ``stale_by_optimizer`` block (:class:`StalePerOptimizer`) with several."""

    kind = "missing_zero_grad"
    boundary = "gradients"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_steps": 3}

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.min_steps = int(threshold(self, "min_steps"))
        self._run: list[tuple[int, float, float]] = []
        self._runs: dict[int, list[tuple[int, float]]] = {}
        self._reported = False
        self._probe = _Setup(self)
        self._per_optimizer = StalePerOptimizer()

    def probes(self) -> Sequence[Probe]:
        return (self._probe, self._per_optimizer)

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if not self._probe.enabled or self._reported:
            return []
        if self._per_optimizer.active:
            return self._observe_per_optimizer(records)
        for rec in trained_rows(records):
            if rec.step == 0:
                continue
            stale = rec.value("misc", "stale_grad_norm")
            if rec.meta.stale_grads and stale > 0 and math.isfinite(stale):
                grads = rec.array("grad_norm")
                total = float(math.sqrt(float((grads.astype("float64") ** 2).sum())))
                self._run.append((rec.step, stale, total))
            else:
                self._run = []
            if len(self._run) >= self.min_steps:
                self._reported = True
                steps = [r[0] for r in self._run]
                return [self.finding(
                    f"gradients from the previous step were still present at the first backward of "
                    f"{len(self._run)} consecutive steps (stale norm {self._run[-1][1]:.4g}): "
                    "zero_grad() is not called, so each step applies the sum of all past gradients",
                    module=None, step=steps[-1], onset_step=steps[0], severity="error",
                    evidence={"steps": steps, "stale_grad_norm": [r[1] for r in self._run],
                              "grad_norm_at_step": [r[2] for r in self._run]},
                    next_check="clear_gradients_every_step",
                )]
        return []

    def _observe_per_optimizer(self, records: Sequence[StepRecord]) -> list[Finding]:
        for rec in trained_rows(records):
            if BLOCK not in rec.blocks:
                return []
            for i, value in enumerate(rec.array(BLOCK).tolist()):
                if value < 0:
                    continue  # this optimizer did not step in this row
                run = self._runs.setdefault(i, [])
                if value > 0 and math.isfinite(value):
                    run.append((rec.step, value))
                else:
                    run.clear()
                if len(run) >= self.min_steps:
                    self._reported = True
                    return [self._per_optimizer_finding(i, run)]
        return []

    def _per_optimizer_finding(self, i: int, run: list[tuple[int, float]]) -> Finding:
        names = self._probe.optimizer_names[i] if i < len(self._probe.optimizer_names) else []
        owner = common_module(self.ctx.owner(n) for n in names) if names else ""
        where = f"'{owner}'" if owner else "the model"
        steps = [s for s, _ in run]
        return self.finding(
            f"optimizer {i} ({self._probe.optimizer_types[i]} over {len(names)} parameter(s) of {where}) "
            f"stepped {len(run)} times in a row with gradients never cleared since its previous step "
            f"(stale norm {run[-1][1]:.4g}); each of its steps applies the sum of all its past gradients: "
            f"expected a zero_grad() for {where} between its steps (e.g. {owner or 'model'}.zero_grad() or "
            f"optimizers[{i}].zero_grad() before its backward)",
            module=owner or None, step=steps[-1], onset_step=steps[0], severity="error",
            evidence={"optimizer": i, "steps": steps, "stale_grad_norm": [v for _, v in run],
                      "parameters": names[:8]},
            next_check="clear_gradients_every_step",
        )


class _Setup(Probe):
    """Host facts at attach: whether the check applies, and what each optimizer holds."""

    name = "missing_zero_grad"
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"ctx", "enabled", "optimizer_names", "optimizer_types"})

    def __init__(self, detector: MissingZeroGradDetector) -> None:
        self.ctx = detector.ctx
        self.enabled = True
        self.optimizer_names: list[list[str]] = []
        self.optimizer_types: list[str] = []

    def setup(self, host: ProbeHost) -> None:
        # Trainable parameters outside the optimizer are never cleared by its zero_grad(); their
        # leftover gradients are unregistered_parameter's evidence, not a missing zero_grad().
        # Without an optimizer each backward() is a step: a hand-written loop must clear the
        # gradients itself (model.zero_grad()), so the check applies there too.
        self.enabled = not any(p.requires_grad and n not in self.ctx.optimizer_params for n, p in host.params)
        names = {id(p): n for n, p in host.params}
        self.optimizer_names = [[names[id(p)] for g in o.param_groups for p in g["params"] if id(p) in names]
                                for o in host.optimizers]
        self.optimizer_types = [type(o).__name__ for o in host.optimizers]
