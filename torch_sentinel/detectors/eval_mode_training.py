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

import dataclasses
import weakref
from collections.abc import Iterable
from typing import Any, Optional

import torch
from torch import nn

from .._collect.compat import is_compiling as _is_compiling
from .._collect.probe import Probe, ProbeHost
from .._findings import Finding
from .._record import Fact, StepRecord
from .base import Detector, Threshold

__all__ = ["EvalModeTrainingDetector", "ModeWatch", "ModesAtBackward"]

_MODE_DEPENDENT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)
#: Stands first in ``ModesAtBackward.in_eval`` when the whole model was in eval mode.
ROOT_EVAL = "<root-eval>"


@dataclasses.dataclass(frozen=True)
class ModesAtBackward(Fact):
    """Dropout / batch-norm modules that were in eval mode in a training forward followed by a
    backward, in this step (trainable ones only: a deliberately frozen batch norm is left out)."""

    #: Module names; ``ROOT_EVAL`` first when the model itself was in eval mode.
    in_eval: tuple[str, ...]
    #: The outermost module in eval mode that holds every one of them (``netG`` when a
    #: generator was left in eval), else the first of them.
    owner: str


class ModeWatch(Probe):
    """Reads the ``training`` flags of mode-dependent modules at each training forward (host
    state: a Python attribute read per candidate module, so every step is read, and a
    ``model.train()`` forgotten after a mid-run validation is seen at the next step), and keeps
    them when a backward follows."""

    name = "modes"
    publishes = (ModesAtBackward,)

    def __init__(self) -> None:
        self._candidates: list[tuple[str, weakref.ref[nn.Module], weakref.ref[nn.Module]]] = []
        self._root: Any = None
        self._host: Optional[ProbeHost] = None
        self._last: tuple[str, ...] = ()
        self._root_called = False
        self._modules: dict[str, weakref.ref[nn.Module]] = {}

    def setup(self, host: ProbeHost) -> None:
        # Without an optimizer each backward() through the model is a step (hand-written
        # updates), so the flags are read the same way: a forward followed by a backward.
        modules = dict(host.map.modules)
        self._root = weakref.ref(host.map.root)
        self._modules = {name: weakref.ref(m) for name, m in host.map.modules}
        for name, m in host.map.modules:
            if isinstance(m, _MODE_DEPENDENT):
                parent = modules.get(name.rpartition(".")[0], host.map.root)
                self._candidates.append((name, weakref.ref(m), weakref.ref(parent)))
        if self._candidates:
            self._host = host

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._host is None or _is_compiling():
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
            off.insert(0, ROOT_EVAL)  # the whole model was in eval mode at this forward
        return tuple(off)

    def on_backward(self, loss: torch.Tensor) -> None:
        c = self._host
        if c is None:
            return
        if c.traced or (not self._root_called and not _is_compiling()):
            # Under torch.compile the forward hooks run only while tracing; backward() is
            # called from eager code, where the modes of this step's forward still hold. A
            # container attached as the root but never called itself (a GAN's ModuleDict whose
            # loop calls netG and netD directly) is read at the backward too.
            self._last = self._off()
        self._root_called = False
        if self._last:
            names = self._last[1:] if self._last[0] == ROOT_EVAL else self._last
            c.publish(ModesAtBackward(self._last, self._owner(names) if names else ""))
        self._last = ()

    def _owner(self, names: tuple[str, ...]) -> str:
        parts = names[0].split(".")
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k])
            ref = self._modules.get(prefix)
            m = ref() if ref is not None else None
            if m is not None and not m.training and all(n.startswith(prefix + ".") for n in names):
                return prefix
        return names[0]


class EvalModeTrainingDetector(Detector):
    """``eval_mode_training``: optimizer steps taken while dropout / batch norm are in eval mode."""

    kind = "eval_mode_training"
    rung = "forward"
    next_check = "call_model_train_before_training"
    hypothesis = "model.eval() was left on while training"
    reads = (ModesAtBackward,)
    thresholds = {"min_steps": Threshold(2, "checked steps: one could be a deliberate eval-mode step")}

    def setup(self) -> None:
        self.min_steps = int(self.threshold("min_steps"))
        self._hits: list[tuple[int, tuple[str, ...]]] = []
        self._owner = ""
        self._reported = False

    def update(self, record: StepRecord) -> None:
        seen = record.fact(ModesAtBackward)
        if seen is not None and len(self._hits) < 16:
            self._hits.append((record.step, seen.in_eval))
            self._owner = seen.owner

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if self._reported or len(self._hits) < self.min_steps:
            return []
        self._reported = True
        names = self._hits[-1][1]
        root_eval = names[0] == ROOT_EVAL
        names = names[1:] if root_eval else names
        module = "" if root_eval else self._owner
        types = sorted({self.ctx.module_types.get(n, "") for n in names})
        return [self.finding(
            f"{len(names)} {'/'.join(types)} module(s) were in eval mode during training forwards "
            f"followed by backward at steps {[s for s, _ in self._hits][:6]}"
            + (": the whole model is in eval mode (model.train() not called after eval?)" if root_eval else ""),
            module=module, step=self._hits[self.min_steps - 1][0], onset_step=self._hits[0][0],
            severity="error",
            evidence={"modules": list(names)[:8], "count": len(names), "steps": [s for s, _ in self._hits][:8],
                      "model_in_eval": root_eval},
        )]
