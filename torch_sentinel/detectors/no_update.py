"""``no_update``: parameters receive non-zero gradients but do not change across steps.

The evidence is the norm of each parameter *before* consecutive optimizer steps: when it is
bit-identical before step k and step k-1 although step k-1 had a non-zero gradient, step k-1
did not move the weights, either because it had no effect (lr 0, a step on other tensors) or
because the update was undone between steps (weights restored, a state_dict reloaded).
Also reported: gradients cleared between ``backward()`` and ``step()`` (every step sees no
gradient at all), and ``optimizer.step()`` never called while backward ran.

A bit-identical L2 norm is second-order evidence only: a weight just before a normalisation
layer (Linear/Conv then BatchNorm/LayerNorm) is scale-invariant, its gradient is orthogonal to
it, and an SGD step changes its norm by ``(lr |g| / |W|)^2 / 2``, below float32's resolution
although every element moved. So a still norm is confirmed with a first-order fingerprint
before it is reported: the L1 norm of the weight accumulated in float64 (``sum sign(w) dw``
moves at first order) and its largest magnitude (for a gradient whose signed sum rounds to
0, as a BatchNorm weight's before another normalisation can), taken before every step for the first 10 steps and afterwards only for
the parameters whose L2 norm stood still (candidates), and compared step to step on the device
(the row holds the relative change). Only a parameter whose fingerprint did not change either
is still.

Thresholds:
- ``no_update.min_still`` = 3 consecutive still steps per parameter: a warm-up whose first step
  has lr 0 gives one still step, which is healthy.
- A still stretch whose lr is positive but below 1e-3 of the largest lr seen so far (the tail
  of a decay) is exempt: such steps can be too small to see. An lr of *exactly* 0 after it was
  positive is not a tail: nothing can move any more (a StepLR with gamma 0, a cosine schedule to
  min_lr=0 whose T_max ends before the run), so those steps count and the finding names the
  step where the lr fell to 0.
- An optimizer whose parameters are all frozen (``requires_grad=False``) while backward runs
  updates nothing: reported after ``min_still`` such steps, naming the optimizer as the cause.
- AMP-skipped steps and frozen parameters are never counted; with several optimizers, a
  parameter is judged only on rows where its own optimizer stepped (critic steps of a GAN).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Optional

import torch

from .._collect.compat import is_compiling
from .._collect.probe import Probe, ProbeHost
from .._collect.records import StepMeta, StepRecord
from .._collect.tensors import reduces
from .._findings import Finding
from ._common import common_module, threshold
from .base import Detector, RunContext
from .unregistered_parameter import GRAPH_CUT

__all__ = ["NoUpdateDetector"]

#: Relative change of a norm that float32 reliably resolves (its epsilon is 1.2e-7); norms are
#: accumulated in float32 or better (``_collect/probes/norms.py``), and a weight dtype coarser
#: than that raises the bar to its own epsilon.
_RESOLUTION = 1e-5
#: The ledger block holding, per parameter, the relative change of its fingerprint since the
#: previous step (valid for the names in ``meta.extra[FINGERPRINTED]``).
_BLOCK = "weight_change"
FINGERPRINTED = "fingerprinted"
_ROW = "no_update.row"
#: Rows (steps) from the attach on which every watched weight is fingerprinted (then: candidates only).
_FINGERPRINT_ALL = 10


class NoUpdateDetector(Detector, Probe):
    kind = "no_update"
    boundary = "updates"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_still": 3}
    #: Set up at attach from the model and its optimizers (the fingerprints hold device
    #: tensors of the live weights).
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"_host", "_fp", "_resolution", "_optimizer_of", "_unprintable"})

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.min_still = int(threshold(self, "min_still"))
        self._prev: Optional[StepRecord] = None
        self._still: dict[str, list[int]] = {}
        self._max_lr = 0.0
        self._cleared_steps: list[int] = []
        self._frozen_steps: list[int] = []
        self._resolution: dict[str, float] = {}
        #: the first step whose lr was exactly 0 after a positive lr (None while it is positive)
        self._lr_zero_since: Optional[int] = None
        #: optimizer steps with a backward taken since the lr fell to exactly 0 (host facts:
        #: seen every step, with no need for the sampled weight norms)
        self._lr_zero_steps: list[int] = []
        self._reported: set[str] = set()
        self._host: Optional[ProbeHost] = None
        #: parameter name -> index of the optimizer holding it (read with several optimizers)
        self._optimizer_of: dict[str, int] = {}
        #: parameters whose L2 norm stood still: fingerprinted before each step from now on
        self._candidates: set[str] = set()
        #: parameters whose still norm a fingerprint confirmed in the current still stretch, and
        #: the step of the first confirmed pair (a still norm alone is weaker evidence)
        self._confirmed: dict[str, int] = {}
        #: parameters that cannot be fingerprinted (float8, sharded): the L2 norm decides alone
        self._unprintable: set[str] = set()
        self._fp: Optional[_Fingerprints] = None
        #: rows closed so far (the row number stamped into each row's meta)
        self._rows = 0
        #: the step of the row after the last still pair, per parameter (where it was seen)
        self._still_until: dict[str, int] = {}
        #: derived from the run (never checkpointed): the watched names
        self._watched_cache: Optional[list[str]] = None

    def setup(self, host: ProbeHost) -> None:
        self._host = host
        # A step smaller than the weight's own resolution is rounded away: bf16 keeps ~3
        # significant digits (eps 7.8e-3), so only steps above that are evidence there.
        self._resolution = {n: max(_RESOLUTION, float(torch.finfo(p.dtype).eps))
                            for n, p in host.params if p.is_floating_point()}
        index = {id(p): i for i, o in enumerate(host.optimizers) for g in o.param_groups for p in g["params"]}
        self._optimizer_of = {n: index[id(p)] for n, p in host.params if id(p) in index}
        printable = [(n, p) for n, p in host.params
                     if p.is_floating_point() and not host.sharded and reduces(p.dtype, p.device)]
        self._unprintable = {n for n, _ in host.params} - {n for n, _ in printable}
        if printable:
            self._fp = _Fingerprints(host, printable, lambda: self._candidates)

    def on_pre_step(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        if self._fp is None:
            return
        try:
            self._fp.take(self._rows)
        except Exception as exc:  # a device or dtype without a float64 L1 norm
            # Only the fingerprints stop: the still L2 norm decides alone, as before them.
            self._unprintable.update(self._fp.names)
            self._fp = None
            warnings.warn(
                f"torch_sentinel: no_update's first-order weight fingerprints are not taken "
                f"({type(exc).__name__}: {exc}); a still weight norm is reported without them, so a "
                "scale-invariant weight before a normalisation layer may be reported as not updating",
                RuntimeWarning, stacklevel=2)

    def on_row_close(self, meta: StepMeta) -> None:
        # Rows are compared when they are consecutive rows, whatever their step numbers:
        # Lightning's manual optimization with two optimizers numbers them 0, 2, 4, ...
        meta.extra[_ROW] = self._rows
        self._rows += 1

    def close(self) -> None:
        self._fp = None

    def _watched(self) -> list[str]:
        """Trainable parameters the optimizer holds (fixed for the run: computed once)."""
        if self._watched_cache is None:
            held = self.ctx.optimizer_params
            self._watched_cache = [n for n in self.ctx.param_names if n in held and not n.startswith("<")]
        return self._watched_cache

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        found: list[Finding] = []
        watched = self._watched()
        for rec in records:
            lrs = [lr for lr in rec.meta.lrs if lr is not None]
            prev = self._prev
            if prev is not None and prev.meta.extra.get(_ROW, -2) == rec.meta.extra.get(_ROW, -1) - 1 \
                    and prev.meta.weights_recorded \
                    and rec.meta.weights_recorded and prev.meta.backward_calls and not prev.meta.amp_skipped:
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
            if len(self._cleared_steps) < 16 and self._all_cleared(rec, watched):
                self._cleared_steps.append(rec.step)
            self._prev = rec
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
            f"the learning rate fell to exactly 0 at step {fell} after peaking at {self._max_lr:.3g} "
            f"and stayed 0 for {len(steps)} optimizer steps with a backward: no parameter can move "
            "any more (a step schedule with gamma 0, or a decay to min_lr=0 that ends before the "
            "run does?)",
            module="", step=steps[self.min_still - 1], onset_step=fell, severity="error",
            evidence={"lr_zero_since": fell, "max_lr_seen": self._max_lr, "steps": steps[:16],
                      "parameters_watched": len(watched)},
            next_check="inspect_optimizer_update",
        )]

    def _all_frozen(self, rec: StepRecord) -> bool:
        """A backward ran, yet every parameter the optimizer holds has requires_grad=False."""
        if not rec.meta.frozen:
            return False  # the usual case, without a pass over the parameters
        opt = [n for n in self.ctx.param_names if n in self.ctx.optimizer_params]
        return bool(rec.meta.backward_calls and opt) and set(opt) <= set(rec.meta.frozen)

    @staticmethod
    def _all_cleared(rec: StepRecord, watched: list[str]) -> bool:
        """A backward ran, yet no watched trainable parameter had a gradient at the step."""
        meta = rec.meta
        if not meta.grad_missing:
            return False  # some trainable parameter had a gradient (or none is trainable)
        trainable = set(watched) - set(meta.frozen)
        if not (meta.backward_calls and not meta.amp_skipped and trainable):
            return False
        return len(meta.grad_missing) >= len(trainable) and trainable <= set(meta.grad_missing)

    def _compare(self, prev: StepRecord, rec: StepRecord, watched: list[str]) -> None:
        pre0, pre1, grads = prev.mapping("param_norm"), rec.mapping("param_norm"), prev.mapping("grad_norm")
        lrs = [lr for lr in prev.meta.lrs if lr is not None]
        decayed = bool(lrs) and self._max_lr > 0 and 0 < max(lrs) < 1e-3 * self._max_lr
        lr_zero = bool(lrs) and max(lrs) == 0
        lr = max(lrs) if lrs else 1.0
        skip = set(prev.meta.frozen) | set(prev.meta.grad_missing)
        printed = set(rec.meta.extra.get(FINGERPRINTED, ())) if rec.has(_BLOCK) else set()
        stepped = prev.meta.extra.get("stepped")
        if stepped is not None:  # several optimizers: only those that stepped in that row moved anything
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
                if name in printed and rec.value(_BLOCK, name) > 0:
                    # The norm stood still but the weights moved (a scale-invariant weight).
                    self._still.pop(name, None)
                    self._confirmed.pop(name, None)
                    continue
                if name in printed or name in self._unprintable:
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
        lrs = rec.meta.lrs if rec is not None else []
        steps = sorted({s for v in still.values() for s in v})
        grads = rec.mapping("grad_norm") if rec is not None else {}
        lr_zero = bool(lrs) and all(lr == 0 for lr in lrs if lr is not None)
        fell = self._lr_zero_since
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
            next_check="inspect_optimizer_update",
        )]

    def _cleared_finding(self) -> list[Finding]:
        if "<cleared>" in self._reported or len(self._cleared_steps) < self.min_still:
            return []
        cut = self.ctx.extras.get(GRAPH_CUT)
        if cut and cut["leaves"] and not cut["reached_params"]:
            return []  # the loss never reached the parameters: no_gradient names the cut
        self._reported.add("<cleared>")
        return [self.finding(
            f"backward() ran but no parameter had a gradient at {len(self._cleared_steps)} "
            "optimizer steps: the gradients are cleared between backward() and step() (is "
            "zero_grad() called after backward?), so every step does nothing",
            module="", step=self._cleared_steps[self.min_still - 1],
            onset_step=self._cleared_steps[0], severity="error",
            evidence={"steps": self._cleared_steps[:16], "parameters_watched": len(self._watched())},
            next_check="inspect_optimizer_update",
        )]

    def _frozen_finding(self) -> list[Finding]:
        if "<frozen>" in self._reported or len(self._frozen_steps) < self.min_still:
            return []
        self._reported.add("<frozen>")
        opt = [n for n in self.ctx.param_names if n in self.ctx.optimizer_params and not n.startswith("<")]
        module = common_module(self.ctx.owner(n) for n in opt)
        trainable_outside = [n for n in self.ctx.param_names if n not in self.ctx.optimizer_params
                             and n not in set(self._prev.meta.frozen if self._prev else ())]
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
            next_check="inspect_optimizer_update",
        )]

    def finish(self) -> Iterable[Finding]:
        c = self._host
        if c is None or c.step > 0 or not c.optimizers or c.meta.backward_calls < self.min_still:
            return ()
        return [self.finding(
            f"backward() ran {c.meta.backward_calls} times but optimizer.step() was never called",
            module="", step=0, severity="error",
            evidence={"backward_calls": c.meta.backward_calls, "optimizer_steps": 0},
            next_check="inspect_optimizer_update",
        )]


class _Fingerprints:
    """First-order fingerprints of the weights (L1 norms accumulated in float64, and the largest
    magnitude), taken before a
    step, and their relative change since the previous step written into the row: device ops
    only; which names hold a valid change is host bookkeeping (``meta.extra``)."""

    def __init__(self, host: ProbeHost, params: list[tuple[str, torch.Tensor]],
                 candidates: Callable[[], set[str]]) -> None:
        self.host = host
        self.names = [n for n, _ in params]
        self.tensors = {n: p for n, p in params}
        self.candidates = candidates
        self.block = host.ledger.add_block(_BLOCK, [n for n, _ in host.params], -1.0)
        self.slot = {n: i for i, (n, _) in enumerate(host.params)}
        self.position = {n: i for i, n in enumerate(self.names)}
        self.dtype = torch.float32 if host.device.type == "mps" else torch.float64
        self.previous: Optional[torch.Tensor] = None
        self.taken: dict[str, int] = {}
        self._index: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def take(self, row: int) -> None:
        """Fingerprint before the step of row number ``row`` (rows count 0, 1, 2, ...)."""
        host = self.host
        if is_compiling() or not host.meta.weights_recorded or host.meta.extra.get(FINGERPRINTED) is not None:
            return  # once per row, on the rows whose weight norms were read
        wanted = self.candidates()
        if row >= _FINGERPRINT_ALL and not wanted:
            return  # the usual case once training runs: nothing to confirm, nothing to pay
        names = tuple(self.names if row < _FINGERPRINT_ALL else [n for n in self.names if n in wanted])
        host.meta.extra[FINGERPRINTED] = ()
        if not names:
            return
        with torch.no_grad():
            weights = [self.tensors[n].detach() for n in names]
            # Two prints per weight: its L1 norm and its largest magnitude (the L1 norm alone is
            # blind when sum(sign(w) dw) rounds to 0: a BatchNorm weight of ones followed by
            # another normalisation gets a gradient summing to ~0, and 8% of its SGD steps
            # left both the L2 and the L1 norm bit-identical while every element moved).
            fp = torch.stack([t.to(host.device) for t in (
                *torch._foreach_norm(weights, 1, dtype=self.dtype),
                *torch._foreach_norm(weights, math.inf, dtype=self.dtype))]).view(2, -1)
            at, slots = self._indices(names)
            if self.previous is None:
                self.previous = torch.zeros((2, len(self.names)), dtype=self.dtype, device=host.device)
            before = self.previous.index_select(1, at)
            change = ((fp - before).abs() / before.abs().clamp_min(torch.finfo(self.dtype).tiny)).amax(0)
            dest = host.ledger.current[self.block.start : self.block.stop]
            dest.index_copy_(0, slots, change.to(dest.dtype))
            self.previous.index_copy_(1, at, fp)
        host.meta.extra[FINGERPRINTED] = tuple(n for n in names if self.taken.get(n) == row - 1)
        for n in names:
            self.taken[n] = row

    def _indices(self, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._index.get(names)
        if cached is None:
            device = self.host.device
            cached = (torch.tensor([self.position[n] for n in names], device=device),
                      torch.tensor([self.slot[n] for n in names], device=device))
            self._index = {names: cached}
        return cached
