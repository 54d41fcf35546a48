"""``no_gradient``: trainable parameters in the optimizer that never receive a gradient.

The graph was cut (``detach()``, ``.item()``/numpy round trips, ``torch.tensor(...)`` of an
output) or a branch is unused. A parameter counts as gradient-less at a step when its ``.grad``
is None or its norm is exactly 0. Never flagged: ``requires_grad=False`` parameters, tensors the
optimizer holds that are not in the model (``unregistered_parameter`` explains those), and runs
where no parameter got a gradient at all (that is ``no_update``'s "cleared before step").

A graph cut by rebuilding a tensor (``torch.tensor(out.tolist(), requires_grad=True)``, a numpy
round trip, ``.detach().requires_grad_()``) leaves a new leaf that requires grad between the
model and the loss; the walk of the loss's graph finds it (``_collect/graph_walk.py``), and when
the loss reaches no parameter at all this detector reports the cut itself, even though no
parameter got a gradient at all.

Threshold: ``no_gradient.min_steps`` = 5 steps with a backward, all gradient-less for the
parameter: one step could be a branch skipped by chance, five in a row is a wiring fault.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np
import torch

from .._collect.graph_walk import LossGraph
from .._collect.probes.norms import GradNorms
from .._findings import Finding
from .._record import StepRecord
from ._common import GraphCut, common_module, trained
from .base import Detector, Threshold

__all__ = ["NoGradientDetector"]


class NoGradientDetector(Detector):
    kind = "no_gradient"
    rung = "gradients"
    next_check = "inspect_graph_connectivity"
    hypothesis = "the graph is cut (detach, numpy round trip) or a branch is unused"
    reads = (GradNorms, LossGraph)
    thresholds = {"min_steps": Threshold(5, "steps with a backward: one could be a branch skipped by chance, "
                                            "five in a row is a wiring fault")}

    def setup(self) -> None:
        self.min_steps = int(self.threshold("min_steps"))
        self.cut = GraphCut()
        self._steps = 0
        self._first_step: dict[str, int] = {}
        self._ever: set[str] = set()
        #: Parameters whose .grad existed but was exactly 0 (not None) at some step.
        self._zero: set[str] = set()
        self._reported = False
        self._cut_steps: list[int] = []
        #: Derived from the run (never checkpointed): the watched names, and their slots in a
        #: record layout.
        self._watched_cache: Optional[list[str]] = None
        self._index_cache: Optional[tuple[Sequence[str], np.ndarray, dict[str, int]]] = None
        self._settled_cache: Optional[np.ndarray] = None

    def update(self, record: StepRecord) -> None:
        self.cut.add(record)
        grads = record.fact(GradNorms)
        if grads is None or not trained(record):
            return
        watched = self._watched()
        keys = grads.names
        if self._index_cache is None or self._index_cache[0] is not keys:
            index = {k: i for i, k in enumerate(keys)}
            self._index_cache = (keys, np.array([index[n] for n in watched], dtype=np.int64), index)
        _, slots, index = self._index_cache
        # Per parameter: a gradient (present, nonzero), frozen (never a wiring fault), or
        # none. Frozen and missing parameters are few: the rest is one comparison.
        got = grads.at_step[slots] != 0
        frozen = [index[n] for n in grads.frozen if n in index]
        missing = [index[n] for n in grads.missing if n in index]
        if frozen or missing:
            gone = np.zeros(len(keys), dtype=bool)
            gone[frozen + missing] = True
            got &= ~gone[slots]
        got_any = bool(got.any())
        if not self._ever.issuperset(watched):  # sets only grow: once complete, nothing to add
            self._ever.update(watched[i] for i in np.flatnonzero(got).tolist())
        frozen_names = set(grads.frozen) if frozen else set()
        self._ever.update(n for n in watched if n in frozen_names)
        idle = np.flatnonzero(~got)
        if not (frozen or missing):
            # Exactly-zero gradients only (a vanishing run has many, every step): the
            # parameters already recorded with their first step and as zero change nothing.
            settled = self._settled()
            idle = idle[~settled[idle]]
            settled[idle] = True
        missing_names = set(grads.missing)
        for i in idle.tolist():
            n = watched[i]
            if n in frozen_names:
                continue
            self._first_step.setdefault(n, record.step)
            if n not in missing_names:
                self._zero.add(n)
        if got_any:
            self._steps += 1
        elif watched and len(self._cut_steps) < 16:
            self._cut_steps.append(record.step)

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        return self._cut_verdict() or self._verdict()

    def _settled(self) -> np.ndarray:
        """Per watched parameter: already in ``_first_step`` and ``_zero`` (an exactly-zero
        gradient records nothing new for it). Derived from those sets, which only grow."""
        if self._settled_cache is None:
            self._settled_cache = np.array(
                [n in self._first_step and n in self._zero for n in self._watched()], dtype=bool
            )
        return self._settled_cache

    def load_state_dict(self, state: dict[str, Any], device: Optional[torch.device] = None) -> None:
        super().load_state_dict(state, device)
        self._settled_cache = None  # rebuilt from the restored sets

    def _watched(self) -> list[str]:
        """The parameters judged: trainable ones the optimizer holds (fixed for the run)."""
        if self._watched_cache is None:
            held = self.ctx.optimizer_params
            self._watched_cache = [n for n in self.ctx.param_names if n in held and not n.startswith("<")]
        return self._watched_cache

    def _cut_verdict(self) -> list[Finding]:
        """The loss's graph starts at a new leaf, not at the model: the graph was cut."""
        if self._reported or not self.cut.cut_off or len(self._cut_steps) < min(self.min_steps, 3):
            return []
        self._reported = True
        shape, first = self.cut.leaves[0]
        return [self.finding(
            f"a new leaf tensor of shape {tuple(shape)} that requires grad sits between the model "
            "and the loss: the graph was cut here (torch.tensor(out.tolist(), requires_grad=True), "
            "a numpy round trip or .detach().requires_grad_() rebuilt the output), so the "
            f"backward stops at it and none of the model's parameters got a gradient in "
            f"{len(self._cut_steps)} steps",
            module="", step=self._cut_steps[min(self.min_steps, 3) - 1], onset_step=first,
            severity="error",
            evidence={"leaf_shape": shape, "leaf_first_step": first,
                      "steps_without_gradient": self._cut_steps[:16],
                      "parameters_watched": len([n for n in self.ctx.param_names
                                                 if n in self.ctx.optimizer_params])},
        )]

    def _verdict(self) -> list[Finding]:
        if self._reported or self._steps < self.min_steps:
            return []
        never = [n for n in self.ctx.param_names if n in self._first_step and n not in self._ever]
        if not never:
            return []
        self._reported = True
        order = {self.ctx.module_names[s]: i for i, s in enumerate(self.ctx.forward_order())}
        owners = [self.ctx.owner(n) or "" for n in never]
        module = common_module(owners)
        if not module and len(set(owners)) > 1:
            # the earliest module in forward order: where the gradient-less region starts
            module = min(set(owners), key=lambda o: order.get(o, 1 << 30))
        zero = [n for n in never if n in self._zero]
        if len(zero) == len(never):
            why = ("their .grad exists but is exactly 0: no signal flows back to them (dead units "
                   "in between, or a cut graph with zero_grad(set_to_none=False))")
        else:
            why = ("the graph is cut before them (detach, numpy/.item() round trip) or their "
                   "branch is unused")
        if self.cut.leaves:
            why += (f"; a new leaf tensor of shape {tuple(self.cut.leaves[0][0])} that requires grad "
                    "is in the loss's graph: the graph was cut there")
        return [self.finding(
            f"{len(never)} trainable parameter(s) under {module or '<model>'} never received a "
            f"gradient in {self._steps} steps with a backward: {why}",
            module=module, step=min(self._first_step[n] for n in never) + self.min_steps - 1,
            onset_step=min(self._first_step[n] for n in never), severity="error",
            evidence={"parameters": never[:8], "count": len(never), "grad_exactly_zero": len(zero),
                      "grad_none": len(never) - len(zero), "steps_observed": self._steps},
        )]
