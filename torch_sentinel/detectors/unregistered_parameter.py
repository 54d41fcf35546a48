"""``unregistered_parameter``: trainable tensors get gradients but no optimizer updates them.

Two sources of evidence:
- model parameters whose gradient norm is non-zero at the step but that sit in no optimizer
  param group (a head replaced after the optimizer was built);
- leaves of the loss's autograd graph that require grad but are neither model parameters nor
  optimizer parameters nor model inputs (submodules kept in a plain Python list, raw tensors
  with ``requires_grad``). The graph is walked on the host at steps 0 and 1, then every
  ``unregistered_parameter.walk_every`` (500) steps: a few milliseconds, no device read.

Membership is read from the optimizers as the run goes (``HeldParameters``,
``_collect/optimizer_watch.py``), not only at ``attach()``: parameters that join an optimizer
mid-run through ``add_param_group`` (gradual unfreezing) are registered from the step they
joined.

A leaf that requires grad but that no module holds, not even in a plain list, is not a forgotten
parameter: it is a tensor rebuilt from the model's output, where the graph was cut;
``no_gradient`` names those (the walk itself is ``_collect/graph_walk.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from .._collect.graph_walk import LossGraph
from .._collect.optimizer_watch import HeldParameters
from .._collect.probes.norms import GradNorms
from .._findings import Finding
from .._record import StepRecord
from ._common import common_module
from .base import Detector, Threshold

__all__ = ["UnregisteredParameterDetector"]


class UnregisteredParameterDetector(Detector):
    kind = "unregistered_parameter"
    rung = "updates"
    next_check = "register_parameters_with_optimizer"
    hypothesis = "trainable tensors are missing from every optimizer param group"
    explains = ("plateau", "no_update")
    reads = (LossGraph, GradNorms, HeldParameters)
    thresholds = {"walk_every": Threshold(500, "steps between walks of the loss's graph (a few ms each, host only)")}
    #: Derived from the run at setup.
    live_attributes = frozenset({"_candidates", "_watching", "_orphans"})

    def setup(self) -> None:
        self._stray: dict[str, tuple[str, list[int], int, int]] = {}
        self._reported: set[str] = set()
        self._orphans = sum(1 for n in self.ctx.param_names if n.startswith("<optimizer"))
        #: Parameters registered in the model after attach: name -> (shape, step).
        self._late: dict[str, tuple[list[int], int]] = {}
        #: Model parameters in no optimizer group that got a gradient: name -> (step, norm).
        self._unoptimized: dict[str, tuple[int, float]] = {}
        self._candidates = [n for n in self.ctx.param_names if n not in self.ctx.optimizer_params]
        self._watching = bool(self.ctx.optimizer_groups)

    def update(self, record: StepRecord) -> None:
        if not self._watching:
            return
        held = record.fact(HeldParameters)
        if held is not None:
            now = {n for group in held.groups for n in group}
            self._candidates = [n for n in self.ctx.param_names if n not in now]
            # a parameter seen outside every group earlier counts only if it is still outside
            self._unoptimized = {n: v for n, v in self._unoptimized.items() if n not in now}
        walk = record.fact(LossGraph)
        if walk is not None:
            for name, shape in walk.late.items():
                self._late.setdefault(name, (list(shape), record.step))
            for label, (owner, shape, numel) in walk.strays.items():
                if label not in self._stray and len(self._stray) < 32:
                    self._stray[label] = (owner, list(shape), numel, record.step)
        grads = record.fact(GradNorms) if self._candidates and record.meta.backward_calls else None
        if grads is not None:
            # a frozen parameter keeps the .grad of an earlier phase: it gets no new gradient
            missing = set(grads.missing) | set(grads.frozen)
            by_name = dict(zip(grads.names, grads.at_step.tolist()))
            for n in self._candidates:
                if n not in missing and n not in self._reported and by_name.get(n, 0.0) > 0:
                    self._unoptimized.setdefault(n, (record.step, by_name[n]))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        found = self._registered_but_unoptimized()
        late = {k: v for k, v in self._late.items() if k not in self._reported}
        if late:
            self._reported.update(late)
            found.append(self.finding(
                f"{len(late)} parameter(s) joined the model after attach (a submodule replaced "
                f"later?) and are not watched: {', '.join(sorted(late)[:4])}; attach once the model "
                "is final, or detach and attach again after replacing modules",
                module=common_module(n.rpartition(".")[0] for n in late), step=min(v[1] for v in late.values()),
                severity="warning", evidence={"parameters": {k: v[0] for k, v in sorted(late.items())[:8]}},
            ))
        stray = {k: v for k, v in self._stray.items() if k not in self._reported}
        if stray:
            self._reported.update(stray)
            module = common_module(v[0] for v in stray.values())
            found.append(self.finding(
                f"{len(stray)} tensor(s) requiring grad receive gradients in the model's backward "
                "but are not registered parameters of the model, so no optimizer updates them "
                f"(kept in a plain list or dict?): {', '.join(sorted(stray)[:4])}",
                module=module, step=min(v[3] for v in stray.values()), severity="error",
                evidence={"tensors": {k: v[1] for k, v in sorted(stray.items())[:8]},
                          "elements": sum(v[2] for v in stray.values())},
            ))
        return found

    def _registered_but_unoptimized(self) -> list[Finding]:
        hit = {n: v for n, v in self._unoptimized.items() if n not in self._reported}
        if not hit:
            return []
        self._reported.update(hit)
        module = common_module(self.ctx.owner(n) for n in hit)
        orphans = (f"; the optimizer holds {self._orphans} tensor(s) that are not in the model "
                   "(was a layer replaced after the optimizer was built?)") if self._orphans else ""
        return [self.finding(
            f"{len(hit)} model parameter(s) under {module or '<model>'} receive gradients but are "
            f"in no optimizer param group{orphans}",
            module=module, step=min(v[0] for v in hit.values()), severity="error",
            evidence={"parameters": sorted(hit)[:8],
                      "grad_norm": {n: v[1] for n, v in sorted(hit.items())[:4]},
                      "optimizer_tensors_not_in_model": self._orphans},
        )]
