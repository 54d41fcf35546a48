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

Two things are told apart from a wiring fault:

- **zero by construction.** A parameter whose ``.grad`` exists but is exactly 0 on every step
  while its module's *output* does receive a gradient (``OutputGradients``) is one the loss does
  not depend on: the output's gradient sums to 0 over it, every step (a bias that cancels in a
  difference of two passes through one module, ``fc(x1) - fc(x2)``; a critic's output bias under
  a Wasserstein loss, ``mean(D(fake)) - mean(D(real))``). That is reported as ``info`` with the
  reason, never as an error. A gradient that is 0 because nothing arrives (a cut graph with
  ``zero_grad(set_to_none=False)``, dead units in between) stays an error.
- **whole networks.** With several optimizers (an encoder and a critic, a GAN's two networks),
  each is judged on its own: an optimizer that stepped ``min_steps`` times while none of its
  parameters ever got a gradient is reported as such, naming its network (the largest module
  holding only its parameters, ``_collect/network_forwards.py``) and how the loss was cut off
  from it: the network's forward ran under ``no_grad``, or ran with gradients on and no backward
  reached it (its output was detached, or the loss does not use it), or did not run.

Threshold: ``no_gradient.min_steps`` = 5 steps with a backward, all gradient-less for the
parameter: one step could be a branch skipped by chance, five in a row is a wiring fault.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np
import torch

from .._collect.graph_walk import LossGraph
from .._collect.network_forwards import NetworkForwards, network_of
from .._collect.probe import Probe
from .._collect.probes.norms import GradNorms
from .._collect.probes.outgrad import OutputGradients
from .._findings import Finding
from .._record import StepRecord
from ._common import GraphCut, common_module, trained
from .base import Detector, Threshold
from .shared_module import ModuleStructure, padding_row_findings

__all__ = ["NoGradientDetector"]


class NoGradientDetector(Detector):
    kind = "no_gradient"
    rung = "gradients"
    next_check = "inspect_graph_connectivity"
    hypothesis = "the graph is cut (detach, numpy round trip) or a branch is unused"
    explains = ("plateau", "vanishing_gradient", "no_update", "update_ratio")
    reads = (GradNorms, LossGraph, OutputGradients, NetworkForwards)
    thresholds = {"min_steps": Threshold(5, "steps with a backward: one could be a branch skipped by chance, "
                                            "five in a row is a wiring fault")}

    def __init__(self) -> None:
        #: The model's structure at attach: embedding rows without a gradient by construction.
        self.structure = ModuleStructure()

    def probes(self) -> Sequence[Probe]:
        return (self.structure,)

    def setup(self) -> None:
        self._structural_done = False
        self.min_steps = int(self.threshold("min_steps"))
        self.cut = GraphCut()
        self._steps = 0
        self._first_step: dict[str, int] = {}
        self._ever: set[str] = set()
        #: Parameters whose .grad existed but was exactly 0 (not None) at some step.
        self._zero: set[str] = set()
        self._reported = False
        #: Parameters a finding already covers (a network cut off, zero by construction, ...).
        self._explained: set[str] = set()
        self._cut_steps: list[int] = []
        #: Derived from the run (never checkpointed): the watched names, and their slots in a
        #: record layout.
        self._watched_cache: Optional[list[str]] = None
        self._index_cache: Optional[tuple[Sequence[str], np.ndarray, dict[str, int]]] = None
        self._settled_cache: Optional[np.ndarray] = None
        #: Modules owning a parameter whose gradient was exactly 0: the largest |gradient| that
        #: arrived at their output (0 while none did).
        self._arrived: dict[str, float] = {}
        self._slot_cache: Optional[dict[str, int]] = None
        #: Per optimizer (with several): the rows it stepped in without any gradient on its
        #: parameters, whether any of them ever got one, and how its network's forward ran.
        self._idle_rows: dict[int, list[int]] = {}
        self._fed: set[int] = set()
        self._forwards: dict[int, list[int]] = {}

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
        self._note_arrivals(record)
        if len(self.ctx.optimizer_groups) > 1:
            self._note_networks(record, {watched[i] for i in np.flatnonzero(got).tolist()})

    def _note_arrivals(self, record: StepRecord) -> None:
        """The largest |gradient| arriving at the output of each module that owns a parameter
        with an exactly-zero gradient (evidence that the zero is by construction)."""
        if not self._zero or self._ever.issuperset(self._zero):
            return
        outgrads = record.fact(OutputGradients)
        if outgrads is None:
            return
        for n in self._zero:
            owner = self.ctx.owner(n)
            if owner is None or n in self._ever:
                continue
            slot = self._slot_of(owner)
            if slot is None or outgrads.hi[slot] < outgrads.lo[slot]:
                continue
            amp = max(abs(float(outgrads.lo[slot])), abs(float(outgrads.hi[slot])))
            if np.isfinite(amp):
                self._arrived[owner] = max(self._arrived.get(owner, 0.0), amp)

    def _slot_of(self, module: str) -> Optional[int]:
        if self._slot_cache is None:
            self._slot_cache = {}
            for i, name in enumerate(self.ctx.module_names):
                self._slot_cache.setdefault(name, i)
        return self._slot_cache.get(module)

    def _note_networks(self, record: StepRecord, fed: set[str]) -> None:
        """Per optimizer that stepped in this row: did any of its parameters get a gradient?"""
        forwards = record.fact(NetworkForwards)
        for i, names in enumerate(self.ctx.optimizer_groups):
            if i not in record.meta.stepped or i in self._fed:
                continue
            if fed.intersection(names):
                self._fed.add(i)
                self._idle_rows.pop(i, None)
                continue
            rows = self._idle_rows.setdefault(i, [])
            if len(rows) < 64:
                rows.append(record.step)
            counts = self._forwards.setdefault(i, [0, 0])
            if forwards is not None and i < len(forwards.with_grad):
                counts[0] += forwards.with_grad[i]
                counts[1] += forwards.without_grad[i]

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if not self._structural_done:  # at attach: what the model's structure already says
            self._structural_done = True
            return padding_row_findings(self, self.structure)
        cut = self._cut_verdict()
        if cut:
            return cut
        return [*self._network_verdicts(), *self._verdict()]

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

    def _network_verdicts(self) -> list[Finding]:
        """An optimizer that stepped ``min_steps`` times while none of its parameters ever got a
        gradient: its whole network is cut off from the loss."""
        found = []
        groups = self.ctx.optimizer_groups
        for i, rows in sorted(self._idle_rows.items()):
            names = [n for n in groups[i] if n in self.ctx.param_owner and n in self.ctx.trainable]
            if i in self._fed or len(rows) < self.min_steps or not names or set(names) <= self._explained:
                continue
            self._explained.update(names)
            others = [n for j, g in enumerate(groups) if j != i for n in g]
            network = network_of(names, self.ctx.param_owner, others)
            with_grad, without_grad = self._forwards.get(i, [0, 0])
            where = f"'{network}'" if network else "the model"
            if without_grad and not with_grad:
                how = (f"{where}'s forward ran under torch.no_grad() ({without_grad} call(s)), so nothing it "
                       "computes enters any loss's graph: run it with gradients enabled where its output "
                       "feeds the loss")
            elif with_grad:
                how = (f"{where}'s forward ran with gradients enabled ({with_grad} call(s)) but no backward "
                       "reached it: its output was detached (.detach(), a numpy or .item() round trip) or "
                       "is not used by the loss before it reaches the loss")
            else:
                how = f"{where}'s forward did not run in these steps: no loss uses it"
            kind = self.ctx.optimizer_types[i] if i < len(self.ctx.optimizer_types) else "optimizer"
            found.append(self.finding(
                f"optimizer {i} ({kind} over the {len(names)} parameter(s) of {where}) stepped in "
                f"{len(rows)} steps, but none of its parameters ever received a gradient: {how}",
                module=network, step=rows[self.min_steps - 1], onset_step=rows[0], severity="error",
                evidence={"optimizer": i, "network": network, "parameters": names[:8], "count": len(names),
                          "steps_without_gradient": rows[:16], "forward_calls_with_grad": with_grad,
                          "forward_calls_under_no_grad": without_grad},
            ))
        return found

    def _verdict(self) -> list[Finding]:
        if self._steps < self.min_steps:
            return []
        never = [n for n in self.ctx.param_names
                 if n in self._first_step and n not in self._ever and n not in self._explained]
        if not never:
            return []
        by_construction = [n for n in never if n in self._zero and self._arrived.get(self.ctx.owner(n) or "", 0.0) > 0]
        faults = [n for n in never if n not in set(by_construction)]
        self._explained.update(never)
        found = []
        if by_construction:
            found.append(self._by_construction(by_construction))
        if faults:
            found.append(self._fault(faults))
        return found

    def _by_construction(self, names: list[str]) -> Finding:
        owners = [self.ctx.owner(n) or "" for n in names]
        module = common_module(owners)
        arrived = {o: self._arrived[o] for o in dict.fromkeys(owners) if o in self._arrived}
        return self.finding(
            f"{len(names)} parameter(s) under {module or '<model>'} got a gradient of exactly 0 in every one "
            f"of {self._steps} steps while their module's output did receive a gradient (largest "
            f"|gradient| {max(arrived.values()):.3g}): the loss does not depend on them, by construction "
            "(a bias that cancels in a difference of two passes through the same module, e.g. "
            "fc(x1) - fc(x2); a critic's output bias under a Wasserstein loss mean(D(fake)) - "
            "mean(D(real))). Not a wiring fault; such a parameter keeps its initial value",
            module=module, step=min(self._first_step[n] for n in names) + self.min_steps - 1,
            onset_step=min(self._first_step[n] for n in names), severity="info",
            next_check="continue_training_or_collect_more_evidence",
            evidence={"parameters": names[:8], "count": len(names), "output_gradient_arrived": arrived,
                      "steps_observed": self._steps, "reason": "loss invariant to the parameter"},
        )

    def _fault(self, never: list[str]) -> Finding:
        order = {self.ctx.module_names[s]: i for i, s in enumerate(self.ctx.forward_order())}
        owners = [self.ctx.owner(n) or "" for n in never]
        module = common_module(owners)
        if not module and len(set(owners)) > 1:
            # the earliest module in forward order: where the gradient-less region starts
            module = min(set(owners), key=lambda o: order.get(o, 1 << 30))
        zero = [n for n in never if n in self._zero]
        if len(zero) == len(never):
            why = ("their .grad exists but is exactly 0 and no gradient reaches their module's output: "
                   "no signal flows back to them (dead units in between, or a cut graph with "
                   "zero_grad(set_to_none=False))")
        else:
            why = ("the graph is cut before them (detach, numpy/.item() round trip) or their "
                   "branch is unused")
        if self.cut.leaves:
            why += (f"; a new leaf tensor of shape {tuple(self.cut.leaves[0][0])} that requires grad "
                    "is in the loss's graph: the graph was cut there")
        return self.finding(
            f"{len(never)} trainable parameter(s) under {module or '<model>'} never received a "
            f"gradient in {self._steps} steps with a backward: {why}",
            module=module, step=min(self._first_step[n] for n in never) + self.min_steps - 1,
            onset_step=min(self._first_step[n] for n in never), severity="error",
            evidence={"parameters": never[:8], "count": len(never), "grad_exactly_zero": len(zero),
                      "grad_none": len(never) - len(zero), "steps_observed": self._steps},
        )
