"""``no_update``: parameters receive non-zero gradients but do not change across steps.

The evidence is the norm of each parameter *before* consecutive optimizer steps: when it is
bit-identical before step k and step k-1 although step k-1 had a non-zero gradient, step k-1
did not move the weights, either because it had no effect (lr 0, a step on other tensors) or
because the update was undone between steps (weights restored, a state_dict reloaded).
Also reported: gradients cleared between ``backward()`` and ``step()`` (every step applies no
gradient: ``.grad`` set to None, a ``zero_grad()`` after the last backward whatever its
``set_to_none``, seen from the call itself (``_collect/optimizer_watch.py``), or a clip call that
multiplied every gradient by 0, ``clip_grad_norm_(params, max_norm=0)``), and
``optimizer.step()`` never called while backward ran.

A bit-identical L2 norm is second-order evidence only (a weight before a normalisation layer is
scale-invariant: its norm moves at second order), so a still norm is confirmed with first-order
fingerprints of the weight before it is reported (``_collect/weight_prints.py``): every weight
on the first 10 rows, afterwards only the parameters whose L2 norm stood still (candidates).
Only a parameter whose fingerprint did not change either is still.

Thresholds:
- ``no_update.min_still`` = 3 consecutive still steps per parameter: a warm-up whose first step
  has lr 0 gives one still step, which is healthy.
- A still stretch whose lr is positive but below 1e-3 of the largest lr seen so far (the tail
  of a decay) is exempt: such steps can be too small to see. An lr of *exactly* 0 after it was
  positive is not a tail: those steps change nothing (a StepLR with gamma 0, a cosine schedule to
  min_lr=0 whose T_max ends before the run), so they count, and the finding says what the
  figures show: the lr has been 0 from the step it fell to 0 through the last step seen (it may
  rise again: a cosine stepped past its T_max climbs back).
- An optimizer whose parameters are all frozen (``requires_grad=False``) while backward runs
  updates nothing: reported after ``min_still`` such steps, naming the optimizer as the cause.
- A converged fit is not a fault: when the loss at every still step is bit-identical and at
  least ``_CONVERGED`` times below the run's first loss, the optimizer declined to move at its
  own tolerance (L-BFGS stops at ``tolerance_change`` on a full batch): reported as ``info``.
- AMP-skipped steps and frozen parameters are never counted; with several optimizers, a
  parameter is judged only on rows where its own optimizer stepped (critic steps of a GAN).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Optional

import torch

from .._collect.graph_walk import LossGraph
from .._collect.optimizer_watch import ClearedBeforeStep
from .._collect.probe import Probe
from .._collect.probes.norms import GradNorms, WeightNorms
from .._collect.weight_prints import WeightChange, WeightPrints
from .._findings import Finding
from .._record import StepRecord
from ._common import GraphCut, common_module
from ._step import PreviousStep as _Step
from .base import Detector, Threshold

__all__ = ["NoUpdateDetector"]

#: Relative change of a norm that float32 reliably resolves (its epsilon is 1.2e-7); norms are
#: accumulated in float32 or better (``_collect/probes/norms.py``), and a weight dtype coarser
#: than that raises the bar to its own epsilon.
_RESOLUTION = 1e-5
#: A loss this many times below the run's first loss, flat to the last bit: a converged fit.
_CONVERGED = 1e3


class NoUpdateDetector(Detector):
    """Owns the fingerprint probe, which it tells which weights to confirm."""

    kind = "no_update"
    rung = "updates"
    next_check = "inspect_optimizer_update"
    hypothesis = "the optimizer does not move these parameters"
    explains = ("plateau", "update_ratio")  # weights that never move: the loss cannot fall
    reads = (GradNorms, WeightNorms, WeightChange, LossGraph, ClearedBeforeStep)
    thresholds = {"min_still": Threshold(3, "consecutive still steps per parameter: a warm-up whose first "
                                            "step has lr 0 gives one, which is healthy")}

    def __init__(self) -> None:
        #: parameters whose L2 norm stood still: fingerprinted before each step from now on
        self._candidates: set[str] = set()
        self.prints = WeightPrints(lambda: self._candidates)

    #: Derived from the run at setup.
    live_attributes = frozenset({"_resolution", "_optimizer_of"})

    def probes(self) -> Sequence[Probe]:
        return (self.prints,)

    def setup(self) -> None:
        self.min_still = int(self.threshold("min_still"))
        self.cut = GraphCut()
        # A step smaller than the weight's own resolution is rounded away: bf16 keeps ~3
        # significant digits (eps 7.8e-3), so only steps above that are evidence there.
        self._resolution = {n: max(_RESOLUTION, float(torch.finfo(dtype).eps))
                            for n, dtype in self.ctx.param_dtypes.items() if dtype.is_floating_point}
        self._prev: Optional[_Step] = None
        #: The run's first finite loss, and the loss of recent steps (for "converged").
        self._first_loss: Optional[float] = None
        self._losses: dict[int, float] = {}
        self._still: dict[str, list[int]] = {}
        self._max_lr = 0.0
        self._cleared_steps: list[int] = []
        #: How the gradients were cleared at those steps: "none" (.grad None), "zero_grad"
        #: (a zero_grad() after the last backward), "clip" (a clip to 0).
        self._cleared_how: dict[str, int] = {}
        self._frozen_steps: list[int] = []
        #: the first step whose lr was exactly 0 after a positive lr (None while it is positive)
        self._lr_zero_since: Optional[int] = None
        #: optimizer steps with a backward taken since the lr fell to exactly 0 (host facts:
        #: seen every step, with no need for the sampled weight norms)
        self._lr_zero_steps: list[int] = []
        self._reported: set[str] = set()
        #: parameter name -> index of the optimizer holding it (read with several optimizers)
        self._optimizer_of = {n: i for i, names in enumerate(self.ctx.optimizer_groups) for n in names}
        #: parameters whose still norm a fingerprint confirmed in the current still stretch, and
        #: the step of the first confirmed pair (a still norm alone is weaker evidence)
        self._confirmed: dict[str, int] = {}
        #: the step of the row after the last still pair, per parameter (where it was seen)
        self._still_until: dict[str, int] = {}
        #: derived from the run (never checkpointed): the watched names
        self._watched_cache: Optional[list[str]] = None

    def _watched(self) -> list[str]:
        """Trainable parameters the optimizer holds (fixed for the run: computed once)."""
        if self._watched_cache is None:
            held = self.ctx.optimizer_params
            self._watched_cache = [n for n in self.ctx.param_names if n in held and not n.startswith("<")]
        return self._watched_cache

    def update(self, record: StepRecord) -> None:
        self.cut.add(record)
        if record.loss is not None and math.isfinite(record.loss):
            if self._first_loss is None:
                self._first_loss = record.loss
            self._losses[record.step] = record.loss
            if len(self._losses) > 64:
                del self._losses[min(self._losses)]
        watched = self._watched()
        rec = record
        lrs = [lr for lr in rec.meta.lrs if lr is not None]
        prev = self._prev
        # Rows are compared when they are consecutive rows, whatever their step numbers:
        # Lightning's manual optimization with two optimizers numbers them 0, 2, 4, ...
        if prev is not None and prev.row == rec.meta.row - 1 and prev.weights is not None \
                and rec.meta.weights_recorded and prev.trained:
            self._compare(prev, rec, watched)
        if lrs:
            if max(lrs) == 0 and self._max_lr > 0 and self._lr_zero_since is None:
                self._lr_zero_since = rec.step
            elif max(lrs) > 0:
                self._lr_zero_since = None
                self._lr_zero_steps = []
            self._max_lr = max(self._max_lr, max(lrs))
        if self._lr_zero_since is not None and rec.meta.backward_calls and not rec.meta.amp_skipped \
                and len(self._lr_zero_steps) < 16:
            self._lr_zero_steps.append(rec.step)
        if len(self._frozen_steps) < 16 and self._all_frozen(rec):
            self._frozen_steps.append(rec.step)
        how = self._cleared(rec, watched)
        if how is not None and len(self._cleared_steps) < 16:
            self._cleared_steps.append(rec.step)
            self._cleared_how[how] = self._cleared_how.get(how, 0) + 1
        elif how is None and "<cleared>" not in self._reported:
            self._cleared_steps = []  # consecutive steps only
            self._cleared_how = {}
        self._prev = _Step.of(rec)

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        watched = self._watched()
        found: list[Finding] = []
        if final:
            found += self._never_stepped()
        found += self._lr_zero_finding(watched)
        found += self._still_findings()
        found += self._cleared_finding()
        found += self._frozen_finding()
        return found

    def _lr_zero_finding(self, watched: list[str]) -> list[Finding]:
        if "<lr0>" in self._reported or len(self._lr_zero_steps) < self.min_still or not watched:
            return []
        self._reported.add("<lr0>")
        self._reported.update(watched)  # the still-weights evidence would only repeat this
        fell, steps = self._lr_zero_since, self._lr_zero_steps
        return [self.finding(
            f"the learning rate fell to exactly 0 at step {fell} after peaking at {self._max_lr:.3g}, "
            f"and was 0 at every step from {fell} through {steps[-1]} so far: the {len(steps)} optimizer "
            "steps with a backward in that stretch changed nothing (a schedule that reaches 0 before "
            "the run ends: a cosine with T_max shorter than the run, a decay to min_lr=0, a step "
            "schedule with gamma 0?)",
            module="", step=steps[self.min_still - 1], onset_step=fell, severity="error",
            evidence={"lr_zero_since": fell, "lr_zero_through": steps[-1], "max_lr_seen": self._max_lr,
                      "steps": steps[:16], "parameters_watched": len(watched)},
        )]

    def _all_frozen(self, rec: StepRecord) -> bool:
        """A backward ran, yet every parameter the optimizer holds has requires_grad=False."""
        if not rec.meta.frozen:
            return False  # the usual case, without a pass over the parameters
        opt = [n for n in self.ctx.param_names if n in self.ctx.optimizer_params]
        return bool(rec.meta.backward_calls and opt) and set(opt) <= set(rec.meta.frozen)

    def _cleared(self, rec: StepRecord, watched: list[str]) -> Optional[str]:
        """How every watched gradient was cleared before this step (None: it was not): all
        ``.grad`` None, a ``zero_grad()`` after the last backward, or a clip to 0."""
        meta = rec.meta
        if not meta.backward_calls or meta.amp_skipped or not watched:
            return None
        trainable = set(watched) - set(meta.frozen)
        if not trainable:
            return None
        if meta.grad_missing and len(meta.grad_missing) >= len(trainable) and trainable <= set(meta.grad_missing):
            return "none"
        cleared = rec.fact(ClearedBeforeStep)
        stepped = set(meta.stepped) if len(self.ctx.optimizer_groups) > 1 else {0}
        if cleared is not None and stepped and stepped <= set(cleared.optimizers):
            return "zero_grad"
        grads = rec.fact(GradNorms)
        if meta.clipped and grads is not None and grads.clipped is not None:
            index = {n: i for i, n in enumerate(grads.names)}
            present = [index[n] for n in trainable - set(meta.grad_missing) if n in index]
            # after the clip every gradient is 0, before it some were not (a coefficient of 0)
            if present and not grads.clipped[present].any() and grads.values[present].any():
                return "clip"
        return None

    def _compare(self, prev: _Step, rec: StepRecord, watched: list[str]) -> None:
        w1 = rec.fact(WeightNorms)
        if prev.weights is None or w1 is None:
            return
        pre0, pre1, grads = prev.weights, w1.by_name(), prev.grads
        lrs = [lr for lr in prev.lrs if lr is not None]
        decayed = bool(lrs) and self._max_lr > 0 and 0 < max(lrs) < 1e-3 * self._max_lr
        lr_zero = bool(lrs) and max(lrs) == 0
        lr = max(lrs) if lrs else 1.0
        skip = set(prev.frozen) | set(prev.grad_missing)
        change = rec.fact(WeightChange)
        printed = set(change.names) if change is not None else set()
        stepped = prev.stepped
        if len(self.ctx.optimizer_groups) > 1:
            # several optimizers: only those that stepped in that row moved anything
            skip |= {n for n in watched if self._optimizer_of.get(n, -1) not in stepped}
        for name in watched:
            g = grads.get(name, 0.0)
            if name in skip or not g > 0:
                continue
            # An SGD-sized step lr * |g| below float32 resolution of the weight's norm cannot be
            # seen (a conv bias before BatchNorm has a gradient of ~1e-9): not evidence.
            visible = lr_zero or lr * g > self._resolution.get(name, _RESOLUTION) * max(pre0[name], 1e-30)
            if not visible:
                continue
            if pre0[name] == pre1[name] and not decayed:
                if change is not None and name in printed and change.values[name] > 0:
                    # The norm stood still but the weights moved (a scale-invariant weight).
                    self._still.pop(name, None)
                    self._confirmed.pop(name, None)
                    continue
                if name in printed or name in self.prints.unprintable:
                    self._confirmed.setdefault(name, prev.step)
                else:
                    self._candidates.add(name)
                still = self._still.setdefault(name, [])
                if len(still) < 16:  # bounded: enough to show persistence
                    still.append(prev.step)
                    self._still_until[name] = rec.step
            else:
                self._still.pop(name, None)
                self._confirmed.pop(name, None)
                self._candidates.discard(name)

    def _still_findings(self) -> list[Finding]:
        still = {n: s for n, s in self._still.items()
                 if len(s) >= self.min_still and n in self._confirmed and n not in self._reported}
        if not still:
            return []
        self._reported.update(still)
        owners = [self.ctx.owner(n) for n in still]
        module = common_module(owners)
        rec = self._prev
        lrs = rec.lrs if rec is not None else []
        steps = sorted({s for v in still.values() for s in v})
        grads = rec.grads if rec is not None else {}
        lr_zero = bool(lrs) and all(lr == 0 for lr in lrs if lr is not None)
        fell = self._lr_zero_since
        flat = self._converged_loss(steps)
        first = self._first_loss
        if flat is not None and first is not None and not lr_zero:
            return [self.finding(
                f"{len(still)} parameter(s) under {module or '<model>'} did not change over {len(steps) + 1} "
                f"consecutive optimizer steps while their gradients were non-zero, but the loss was "
                f"{flat:.4g} at every one of them, bit for bit, {first / max(flat, 1e-300):.3g}x below "
                "its start: a converged fit, where the optimizer declines to move at its own tolerance "
                "(L-BFGS's tolerance_change on a full batch), not a step without effect",
                module=module, step=max(self._still_until.get(n, steps[-1] + 1) for n in still),
                onset_step=min(self._confirmed[n] for n in still), severity="info",
                next_check="continue_training_or_collect_more_evidence",
                evidence={"parameters": sorted(still)[:8], "still_steps": steps[:16], "loss": flat,
                          "first_loss": first, "converged": True},
            )]
        if lr_zero and fell is not None:
            cause = (f"the learning rate fell to exactly 0 at step {fell} after peaking at "
                     f"{self._max_lr:.3g} (a step schedule with gamma 0, or a decay to min_lr=0 "
                     "that ends before the run does?)")
        elif lr_zero:
            cause = "the learning rate is 0"
        else:
            cause = "the step had no effect, or the weights were restored between steps"
        return [self.finding(
            f"{len(still)} parameter(s) under {module or '<model>'} received non-zero gradients but "
            f"were bit-identical before {len(steps) + 1} consecutive optimizer steps: {cause}",
            module=module, step=max(self._still_until.get(n, steps[-1] + 1) for n in still), onset_step=min(self._confirmed[n] for n in still),
            severity="error",
            evidence={"parameters": sorted(still)[:8], "still_steps": steps[:16],
                      "grad_norm": {n: grads.get(n) for n in sorted(still)[:4]},
                      "lrs": [lr for lr in lrs if lr is not None], "max_lr_seen": self._max_lr,
                      "lr_zero_since": fell if lr_zero else None},
        )]

    def _converged_loss(self, steps: list[int]) -> Optional[float]:
        """The loss of a converged fit over ``steps``: bit-identical at each and ``_CONVERGED``
        times below the run's first loss (None otherwise)."""
        first = self._first_loss
        losses = {self._losses.get(st) for st in steps}
        if first is None or first <= 0 or len(losses) != 1:
            return None
        (value,) = losses
        return value if value is not None and 0 <= value * _CONVERGED <= first else None

    def _cleared_finding(self) -> list[Finding]:
        if "<cleared>" in self._reported or len(self._cleared_steps) < self.min_still:
            return []
        if self.cut.cut_off:
            return []  # the loss never reached the parameters: no_gradient names the cut
        self._reported.add("<cleared>")
        how = max(self._cleared_how, key=lambda k: self._cleared_how[k]) if self._cleared_how else "none"
        n = len(self._cleared_steps)
        cause = {
            "none": (f"backward() ran but no parameter had a gradient at {n} optimizer steps: the "
                     "gradients are cleared between backward() and step() (is zero_grad() called "
                     "after backward?), so every step does nothing"),
            "zero_grad": (f"a zero_grad() cleared every gradient after the last backward() and before "
                          f"optimizer.step() at {n} optimizer steps (with set_to_none=False they are "
                          "left as zero tensors): every step applies a zero gradient and the weights "
                          "do not change; call zero_grad() before backward()"),
            "clip": (f"a gradient-clipping call multiplied every gradient by 0 at {n} optimizer steps "
                     "(clip_grad_norm_ with max_norm=0, where 0 was meant as 'no clipping'?): every "
                     "step applies a zero gradient and the weights do not change"),
        }[how]
        return [self.finding(
            cause, module="", step=self._cleared_steps[self.min_still - 1],
            onset_step=self._cleared_steps[0], severity="error",
            evidence={"steps": self._cleared_steps[:16], "parameters_watched": len(self._watched()),
                      "cleared_by": how},
        )]

    def _frozen_finding(self) -> list[Finding]:
        if "<frozen>" in self._reported or len(self._frozen_steps) < self.min_still:
            return []
        self._reported.add("<frozen>")
        opt = [n for n in self.ctx.param_names if n in self.ctx.optimizer_params and not n.startswith("<")]
        module = common_module(self.ctx.owner(n) for n in opt)
        trainable_outside = [n for n in self.ctx.param_names if n not in self.ctx.optimizer_params
                             and n not in set(self._prev.frozen if self._prev else ())]
        return [self.finding(
            f"every one of the {len(opt)} parameter(s) the optimizer holds (under "
            f"{module or '<model>'}) has requires_grad=False, so optimizer.step() changes nothing "
            f"and the run cannot learn" + (
                f"; the {len(trainable_outside)} trainable parameter(s) are in no optimizer "
                "(was the optimizer built over the frozen part, or the freeze inverted?)"
                if trainable_outside else ""),
            module=module, step=self._frozen_steps[self.min_still - 1],
            onset_step=self._frozen_steps[0], severity="error",
            evidence={"optimizer_parameters": len(opt), "frozen": len(opt),
                      "trainable_outside_optimizer": trainable_outside[:8],
                      "steps": self._frozen_steps[:16]},
        )]

    def _never_stepped(self) -> list[Finding]:
        """At the end of the run: backward ran, but no optimizer step ever closed a row."""
        now = self.ctx.in_progress()
        if "<never>" in self._reported or self._prev is not None or not self.ctx.optimizer_groups \
                or now.row > 0 or now.backward_calls < self.min_still:
            return []
        self._reported.add("<never>")
        return [self.finding(
            f"backward() ran {now.backward_calls} times but optimizer.step() was never called",
            module="", step=0, severity="error",
            evidence={"backward_calls": now.backward_calls, "optimizer_steps": 0},
        )]
