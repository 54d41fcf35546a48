"""``unregistered_parameter``: trainable tensors get gradients but no optimizer updates them.

Two sources of evidence:
- model parameters whose gradient norm is non-zero at the step but that sit in no optimizer
  param group (a head replaced after the optimizer was built);
- leaves of the loss's autograd graph that require grad but are neither model parameters nor
  optimizer parameters nor model inputs (submodules kept in a plain Python list, raw tensors
  with ``requires_grad``). The graph is walked on the host at steps 0 and 1, then every
  ``unregistered_parameter.walk_every`` (500) steps: a few milliseconds, no device read.

A leaf that requires grad but that no module holds, not even in a plain list, is not a forgotten
parameter: it is a tensor rebuilt from the model's output (``torch.tensor(out.tolist(),
requires_grad=True)``, a numpy round trip, ``.detach().requires_grad_()``), a new leaf between
the model and the loss where the graph was cut. Those are handed to ``no_gradient`` through
:data:`GRAPH_CUT` in the run context's extras, and named for what they are there.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Optional

import torch

from .._collect.compat import is_compiling as _is_compiling
from .._collect.graph import graph_leaves, locate_attribute
from .._collect.probe import Probe, ProbeHost
from .._collect.records import StepRecord
from .._collect.scope import attached_param_ids
from .._collect.tensors import iter_tensors
from .._findings import Finding
from ._common import common_module, threshold
from .base import Detector, RunContext

__all__ = ["GRAPH_CUT", "UnregisteredParameterDetector"]

#: Key in ``RunContext.extras``: {"leaves": [(shape, step)], "reached_params": bool} per walk.
GRAPH_CUT = "graph_cut"


class UnregisteredParameterDetector(Detector, Probe):
    kind = "unregistered_parameter"
    boundary = "updates"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"walk_every": 500}
    #: Set up at attach (``_known`` holds ids of this process's tensors), or one step's inputs.
    live_attributes: ClassVar[frozenset[str]] = frozenset({"_host", "_walking", "_known", "_inputs", "_orphans"})

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.walk_every = int(threshold(self, "walk_every"))
        self._host: Optional[ProbeHost] = None
        self._walking = False
        self._known: set[int] = set()
        self._inputs: list[weakref.ref[torch.Tensor]] = []
        self._stray: dict[str, tuple[str, list[int], int, int]] = {}
        self._reported: set[str] = set()
        self._orphans = 0
        #: Parameters registered in the model after attach: name -> (shape, step).
        self._late: dict[str, tuple[list[int], int]] = {}

    def setup(self, host: ProbeHost) -> None:
        self._host = host
        if not host.optimizers:
            return
        self._known = {id(p) for p in host.param_tensors}
        self._orphans = sum(1 for n, _ in host.params if n.startswith("<optimizer"))
        # FSDP2 swaps unsharded copies of the parameters in for the forward: the graph's
        # leaves are not the registered DTensors, so the walk would see only strangers.
        self._walking = not host.sharded

    def _walk_now(self, step: int) -> bool:
        return step < 2 or step % self.walk_every == 0

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self._host
        if not self._walking or c is None or _is_compiling() or not self._walk_now(c.step):
            return
        self._inputs = [weakref.ref(t) for t in iter_tensors((args, kwargs)) if t.requires_grad]

    def on_backward(self, loss: torch.Tensor) -> None:
        c = self._host
        if not self._walking or c is None:
            return
        if _is_compiling() or not self._walk_now(c.step) or len(self._stray) >= 32:
            return
        inputs = {id(r()) for r in self._inputs if r() is not None}
        others = attached_param_ids()  # another attached model's parameters are its own business
        leaves = graph_leaves(loss)
        reached = any(id(leaf) in self._known for leaf in leaves)
        for leaf in leaves:
            if id(leaf) in self._known or id(leaf) in inputs or id(leaf) in others or not leaf.requires_grad:
                continue
            owner, path = locate_attribute(c.map.modules, leaf)
            late = _registered_now(c.map.root, leaf) if not owner and path == "<unknown>" else None
            if late is not None:
                # Registered after attach (a submodule replaced later): named, not a graph cut.
                self._late.setdefault(late, (list(leaf.shape), c.step))
                continue
            if not owner and path == "<unknown>":
                cut = self.ctx.extras.setdefault(GRAPH_CUT, {"leaves": [], "reached_params": True})
                if len(cut["leaves"]) < 8:
                    cut["leaves"].append((list(leaf.shape), c.step))
                cut["reached_params"] = cut["reached_params"] and reached
                continue
            label = f"{owner}.{path}" if owner else path
            if label not in self._stray:
                self._stray[label] = (owner, list(leaf.shape), int(leaf.numel()), c.step)

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if self._host is None or not self._known:
            return []
        found = self._registered_but_unoptimized(records)
        late = {k: v for k, v in self._late.items() if k not in self._reported}
        if late:
            self._reported.update(late)
            found.append(self.finding(
                f"{len(late)} parameter(s) joined the model after attach (a submodule replaced "
                f"later?) and are not watched: {', '.join(sorted(late)[:4])}; attach once the model "
                "is final, or detach and attach again after replacing modules",
                module=common_module(n.rpartition(".")[0] for n in late), step=min(v[1] for v in late.values()),
                severity="warning", evidence={"parameters": {k: v[0] for k, v in sorted(late.items())[:8]}},
                next_check="register_parameters_with_optimizer",
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
                next_check="register_parameters_with_optimizer",
            ))
        return found

    def _registered_but_unoptimized(self, records: Sequence[StepRecord]) -> list[Finding]:
        opt = self.ctx.optimizer_params
        candidates = [n for n in self.ctx.param_names if n not in opt and n not in self._reported]
        if not candidates:
            return []
        hit: dict[str, tuple[int, float]] = {}
        for rec in records:
            if not rec.meta.backward_calls:
                continue
            grads = rec.mapping("grad_norm")
            missing = set(rec.meta.grad_missing)
            for n in candidates:
                if n not in missing and grads.get(n, 0.0) > 0 and n not in hit:
                    hit[n] = (rec.step, grads[n])
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
            next_check="register_parameters_with_optimizer",
        )]

    def finish(self) -> Iterable[Finding]:
        return self.observe(())


def _registered_now(root: torch.nn.Module, leaf: torch.Tensor) -> Optional[str]:
    """The name of ``leaf`` among the model's parameters now, if it was registered after attach
    (cold path: runs only on the rare steps the graph is walked)."""
    for name, p in root.named_parameters():
        if p is leaf:
            return name
    return None
