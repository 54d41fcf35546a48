"""``eval_mode_training``: optimizer steps taken while dropout / batch norm are in eval mode.

``model.eval()`` left on after a validation pass silently turns dropout off and freezes the
batch-norm statistics. The check is host-only and costs a Python attribute read per candidate
module, so it runs on *every* training forward (grad enabled): a ``model.train()`` forgotten
after a validation pass in the middle of the run is seen at the next step, not at the next
sampled one. The note counts when that forward is followed by a backward. Deliberately frozen batch norms
(parameters with ``requires_grad=False``, as when fine-tuning a detector backbone) and dropout
inside a fully frozen parent are not flagged.

Threshold: ``eval_mode_training.min_steps`` = 2 checked steps.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from .._collect.compat import is_compiling as _is_compiling
from .._collect.probe import Probe, ProbeHost
from .._collect.records import StepRecord
from .._findings import Finding
from ._common import threshold
from .base import Detector, RunContext

__all__ = ["EvalModeTrainingDetector"]

_MODE_DEPENDENT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


class EvalModeTrainingDetector(Detector, Probe):
    """A detector that is its own probe: host facts at ``on_root_inputs``, kept on ``on_backward``."""

    kind = "eval_mode_training"
    boundary = "forward"
    #: Threshold defaults; override with attach(thresholds={"<kind>.<name>": value}).
    thresholds: ClassVar[dict[str, float]] = {"min_steps": 2}
    #: References into the model, set up at attach.
    live_attributes: ClassVar[frozenset[str]] = frozenset({"_candidates", "_root", "_host", "_eval_parents"})

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.min_steps = int(threshold(self, "min_steps"))
        self._candidates: list[tuple[str, weakref.ref[nn.Module], weakref.ref[nn.Module]]] = []
        self._root: Any = None
        self._host: Optional[ProbeHost] = None
        self._last: tuple[str, ...] = ()
        self._root_called = False
        self._eval_parents: dict[str, weakref.ref[nn.Module]] = {}
        self._hits: list[tuple[int, tuple[str, ...]]] = []
        self._reported = False

    def setup(self, host: ProbeHost) -> None:
        # Without an optimizer each backward() through the model is a step (hand-written
        # updates), so the flags are read the same way: a forward followed by a backward.
        modules = dict(host.map.modules)
        self._root = weakref.ref(host.map.root)
        self._eval_parents = {name: weakref.ref(m) for name, m in host.map.modules}
        for name, m in host.map.modules:
            if isinstance(m, _MODE_DEPENDENT):
                parent = modules.get(name.rpartition(".")[0], host.map.root)
                self._candidates.append((name, weakref.ref(m), weakref.ref(parent)))
        if self._candidates:
            self._host = host

    def _checked(self, step: int) -> bool:
        return True  # module.training is host state: reading it every step is free

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self._host
        if c is None or _is_compiling() or not self._checked(c.step):
            self._last = ()
            return
        self._root_called = True
        self._last = self._off()

    def _off(self) -> tuple[str, ...]:
        """Mode-dependent modules in eval mode now (host facts: ``training`` flags)."""
        off = []
        for name, mref, pref in self._candidates:
            m, parent = mref(), pref()
            if m is None or m.training:
                continue
            own = list(m.parameters(recurse=False))
            if own and not any(p.requires_grad for p in own):
                continue  # a deliberately frozen batch norm
            if parent is not None and not any(p.requires_grad for p in parent.parameters()):
                continue
            off.append(name)
        root = self._root() if self._root is not None else None
        if off and root is not None and not root.training:
            off.insert(0, "<root-eval>")  # the whole model was in eval mode at this forward
        return tuple(off)

    def on_backward(self, loss: torch.Tensor) -> None:
        c = self._host
        if c is None:
            return
        if (c.traced and self._checked(c.step)) or (not self._root_called and not _is_compiling()):
            # Under torch.compile the forward hooks run only while tracing; backward() is
            # called from eager code, where the modes of this step's forward still hold. A
            # container attached as the root but never called itself (a GAN's ModuleDict whose
            # loop calls netG and netD directly) is read at the backward too.
            self._last = self._off()
        self._root_called = False
        if self._last and self._checked(c.step) and len(self._hits) < 16 and (not self._hits or self._hits[-1][0] != c.step):
            self._hits.append((c.step, self._last))
        self._last = ()

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if self._reported or len(self._hits) < self.min_steps:
            return []
        self._reported = True
        names = self._hits[-1][1]
        root_eval = names[0] == "<root-eval>"
        names = names[1:] if root_eval else names
        module = "" if root_eval else self._owner(names)
        types = sorted({self.ctx.module_types.get(n, "") for n in names})
        return [self.finding(
            f"{len(names)} {'/'.join(types)} module(s) were in eval mode during training forwards "
            f"followed by backward at steps {[s for s, _ in self._hits][:6]}"
            + (": the whole model is in eval mode (model.train() not called after eval?)" if root_eval else ""),
            module=module, step=self._hits[self.min_steps - 1][0], onset_step=self._hits[0][0],
            severity="error",
            evidence={"modules": list(names)[:8], "count": len(names), "steps": [s for s, _ in self._hits][:8],
                      "model_in_eval": root_eval},
            next_check="call_model_train_before_training",
        )]

    def _owner(self, names: tuple[str, ...]) -> str:
        """The outermost module in eval mode that holds every flagged module (``netG`` when a
        generator was left in eval), else the first flagged module."""
        parts = names[0].split(".")
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k])
            ref = self._eval_parents.get(prefix)
            m = ref() if ref is not None else None
            if m is not None and not m.training and all(n.startswith(prefix + ".") for n in names):
                return prefix
        return names[0]

    def finish(self) -> Iterable[Finding]:
        return self.observe(())
