"""Gradient clipping, observed: the norms before clipping, from the clip call itself.

The gradient norms are taken at the optimizer's pre-step, where a loop that clips has already
clipped them: every default Hugging Face ``Trainer`` run (``max_grad_norm=1.0``) would read 1.0
at every step, and the exploding-gradient detector would be blind. Recomputing the norms when
the backward completes would cost a second pass over every gradient, once per micro-batch.

Instead the clip is observed: ``clip_grad_norm_`` computes the total norm and hands it to
``torch.nn.utils.clip_grad._clip_grads_with_norm_`` (looked up at call time, so this sees every
caller: ``torch.nn.utils.clip_grad_norm_`` however imported, accelerate's
``Accelerator.clip_grad_norm_``, Lightning's ``gradient_clip_val`` and ``self.clip_gradients``,
and ``torch.nn.utils.clip_grads_with_norm_``). Each call multiplies the gradients of its
parameters by ``min(max_norm / (total_norm + 1e-6), 1)``; that coefficient goes, on the device,
into the ``clip_coef`` slot of each of those parameters (initially 1). On the host the norm
before clipping is ``grad_norm / clip_coef`` per parameter, exactly what the clip call saw, for
the whole model and for every module, at no extra pass. Under AMP the clip call sees unscaled
gradients (``scaler.unscale_`` comes first), so these norms are unscaled too.

Clip calls over parameters of another model are ignored (a call given a generator instead of
a list is taken to cover the whole model: reading the generator would consume it). On torch < 2.6, without
``_clip_grads_with_norm_``, ``clip_grad_norm_`` itself is observed.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import numpy as np
import torch

from ..._record import StepRecord
from ..patches import patch_for
from ..probe import Probe, ProbeHost

__all__ = ["ClipProbe", "preclip"]


def preclip(record: StepRecord, grads: np.ndarray) -> np.ndarray:
    """``grads`` (the per-parameter norms at the optimizer step, float64) as they were before
    the step's clip calls: unchanged where the loop did not clip."""
    if not record.meta.clipped or not record.has("clip_coef"):
        return grads
    coef = record.array("clip_coef").astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        # A coefficient of 0 came from an infinite total norm: the norm before was infinite.
        return np.where(coef > 0, grads / np.where(coef > 0, coef, 1.0), np.inf)


class _ClipListener:
    """Forwards a clip call to its probe; holds it weakly (patches are process-wide)."""

    def __init__(self, probe: ClipProbe, returns_norm: bool) -> None:
        self._probe = weakref.ref(probe)
        self._returns_norm = returns_norm

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        probe = self._probe()
        if probe is not None and not self._returns_norm:
            probe.on_clip(_arg(args, kwargs, 0, "parameters"), _arg(args, kwargs, 1, "max_norm"),
                          _arg(args, kwargs, 2, "total_norm"))

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        probe = self._probe()
        if probe is not None and self._returns_norm:
            probe.on_clip(_arg(args, kwargs, 0, "parameters"), _arg(args, kwargs, 1, "max_norm"), result)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


class ClipProbe(Probe):
    name = "clip"

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.block = host.ledger.add_block("clip_coef", [n for n, _ in host.params], initial=1.0)
        self._index = {id(p): i for i, p in enumerate(host.param_tensors)}
        self._index_cache: dict[tuple[int, ...], torch.Tensor] = {}
        clip_grad = torch.nn.utils.clip_grad
        if hasattr(clip_grad, "_clip_grads_with_norm_"):
            host.hooks.subscribe(patch_for(clip_grad, "_clip_grads_with_norm_"), _ClipListener(self, False))
            public = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
            if public is not None:
                host.hooks.subscribe(patch_for(torch.nn.utils, "clip_grads_with_norm_"), _ClipListener(self, False))
        else:  # torch < 2.6
            for owner in {id(clip_grad): clip_grad, id(torch.nn.utils): torch.nn.utils}.values():
                host.hooks.subscribe(patch_for(owner, "clip_grad_norm_"), _ClipListener(self, True))

    def on_clip(self, parameters: Any, max_norm: Any, total_norm: Any) -> None:
        """One clip call: record its coefficient for the parameters of this model it covers."""
        host = self.host
        if not isinstance(total_norm, torch.Tensor) or max_norm is None:
            return
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        if isinstance(parameters, (list, tuple)):
            slots = tuple(sorted({i for p in parameters if (i := self._index.get(id(p))) is not None}))
        else:
            # A generator (``clip_grads_with_norm_(model.parameters(), ...)`` called directly):
            # consuming it here would rob the clip of its parameters, so take it to cover this
            # whole model, as it does in the loops that call it this way.
            slots = tuple(range(len(self._index)))
        if not slots:
            return  # another model's parameters
        with torch.no_grad():
            # The coefficient clip_grad applies, computed the same way, on the device.
            limit = max_norm.detach().float().to(host.device) if isinstance(max_norm, torch.Tensor) else float(max_norm)
            coef = torch.clamp(limit / (total_norm.detach().float().to(host.device) + 1e-6), max=1.0)
            row = host.ledger.current[self.block.start : self.block.stop]
            if len(slots) == len(row):
                row.mul_(coef)
            else:
                index = self._index_for(slots)
                row.index_copy_(0, index, row.index_select(0, index) * coef)
        host.meta.clipped = True

    def _index_for(self, slots: tuple[int, ...]) -> torch.Tensor:
        index: Optional[torch.Tensor] = self._index_cache.get(slots)
        if index is None:
            index = torch.tensor(slots, device=self.host.device)
            self._index_cache[slots] = index
        return index

    def close(self) -> None:
        self._index_cache = {}
