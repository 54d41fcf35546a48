"""Exact update norms ||W_after - W_before|| on sampled steps (every ``update_every`` steps)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from ..._record import Fact, StepRecord
from ..probe import Probe, ProbeHost
from ..tensors import nbytes, reduces
from .norms import NormsProbe

__all__ = ["KEEP_UPDATE_COPY_BYTES", "UpdateNorms", "UpdateProbe"]

#: Parameter copies for exact update norms are kept between sampled steps up to this size.
KEEP_UPDATE_COPY_BYTES = 256 << 20

_NUMEL = torch.Tensor.numel  # unbound: half the time of a methodcaller (as spike_ring's)


@dataclasses.dataclass(frozen=True)
class UpdateNorms(Fact):
    """The exact ``||W_after - W_before||`` of each watched parameter, on the steps whose update
    was sampled (every ``update_every`` steps, from a copy of the weights)."""

    names: Sequence[str]
    #: float64.
    values: np.ndarray

    def by_name(self) -> dict[str, float]:
        return dict(zip(self.names, self.values.tolist()))


class UpdateProbe(Probe):
    name = "updates"
    publishes = (UpdateNorms,)

    def __init__(self, norms: NormsProbe) -> None:
        self.norms = norms
        self._shadow: Optional[list[torch.Tensor]] = None
        #: The slots (indices into ``host.param_tensors``) the shadow copies, in its order.
        self._slots: list[int] = []
        #: Reused copies, per optimizer (by id).
        self._kept_shadow: dict[int, list[torch.Tensor]] = {}
        #: (optimizer id, parameters it holds) -> its slots.
        self._slots_cache: dict[tuple[int, int], list[int]] = {}

    @property
    def update_every(self) -> int:
        return self.norms.update_every

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.block = host.ledger.add_block("update_norm", [n for n, _ in host.params])
        # Lazy parameters count as 0 until they materialise (they have no size yet).
        self.copy_bytes = sum(nbytes(p) for p in host.param_tensors)
        host.provide(UpdateNorms, _update_norms)

    def _slots_of(self, optimizer: Optional[torch.optim.Optimizer]) -> list[int]:
        """The indices (into ``host.param_tensors``) of the watched parameters ``optimizer``
        holds, whose update a torch op can measure (a dtype torch cannot subtract or norm, float8,
        is left out; the norms probe says so once). Each optimizer's step is measured on its own
        parameters, into their own slots: with several optimizers (a GAN's two networks) the
        row then holds every network's update, not only the last one's with the others at 0."""
        tensors = self.host.param_tensors
        key = (id(optimizer), sum(len(g["params"]) for g in optimizer.param_groups) if optimizer is not None else -1)
        cached = self._slots_cache.get(key)
        if cached is not None:
            return cached  # membership changes only through add_param_group (a new count)
        held: Sequence[int]
        if optimizer is None:
            held = range(len(tensors))
        else:
            ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
            held = [i for i, p in enumerate(tensors) if id(p) in ids]
        slots = [i for i in held if reduces(tensors[i].dtype, tensors[i].device)]
        self._slots_cache[key] = slots
        return slots

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        every = self.update_every
        if every and self.host.step % every == 0:
            slots = self._slots_of(optimizer)
            # The parameters themselves (the pre-step runs under no_grad): a detach would be a
            # new tensor object a parameter, for the garbage collector to count.
            tensors = [self.host.param_tensors[i] for i in slots]
            self._slots = slots
            self._shadow = self._copy_of(id(optimizer), tensors) if tensors else None

    def on_post_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._shadow is None:
            return
        host = self.host
        with torch.no_grad():
            torch._foreach_sub_(self._shadow, [host.param_tensors[i] for i in self._slots])
            full: list[Optional[torch.Tensor]] = [None] * len(host.param_tensors)
            for i, delta in zip(self._slots, self._shadow):
                full[i] = delta
            self.norms.copy_norms(self.block.start, full, self.norms.sharded)
        # DTensor has no _foreach_copy_: sharded models copy afresh.
        keep = self.copy_bytes <= KEEP_UPDATE_COPY_BYTES and not self.norms.sharded
        if keep:
            self._kept_shadow[id(optimizer)] = self._shadow
        self._shadow = None
        host.meta.updates_sampled = True

    def _copy_of(self, key: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The weights before the update, for the exact ||dW|| of a sampled step.

        Small models reuse one set of buffers per optimizer (fresh allocations of a few MB cost
        page faults on every sampled step); above ``KEEP_UPDATE_COPY_BYTES`` the copy is made and
        dropped each time, so the memory is held only between the pre- and post-step hooks.
        """
        kept = self._kept_shadow.get(key)
        # Sizes as element counts (ints: no torch.Size object a parameter). With equal counts a
        # shape can differ only by dims of size 1, which the copy broadcasts element for
        # element; anything else it refuses, and the copy is made afresh.
        if kept is not None and len(kept) == len(tensors) and list(map(_NUMEL, kept)) == list(map(_NUMEL, tensors)) \
                and all(k.dtype is t.dtype and k.device == t.device for k, t in zip(kept, tensors)):
            try:
                torch._foreach_copy_(kept, tensors)
                return kept
            except RuntimeError:
                pass
        return list(torch._foreach_mul(tensors, 1.0))

    def close(self) -> None:
        self._shadow = None
        self._kept_shadow = {}


def _update_norms(record: StepRecord) -> Optional[UpdateNorms]:
    if not record.meta.updates_sampled or not record.has("update_norm"):
        return None
    return UpdateNorms(record.keys("update_norm"), record.array("update_norm").astype(np.float64))
