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
        self._kept_shadow: Optional[list[torch.Tensor]] = None
        #: Optimizers that already stepped in the row in progress (kept by the collector).
        self.stepped: set[int] = set()

    @property
    def update_every(self) -> int:
        return self.norms.update_every

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.block = host.ledger.add_block("update_norm", [n for n, _ in host.params])
        # Lazy parameters count as 0 until they materialise (they have no size yet).
        self.copy_bytes = sum(nbytes(p) for p in host.param_tensors)
        host.provide(UpdateNorms, _update_norms)

    def _watched(self) -> list[torch.Tensor]:
        """The parameters whose updates can be measured: a dtype torch cannot subtract or
        norm (float8) is left out here; the norms probe says so once."""
        return [p.detach() for p in self.host.param_tensors if reduces(p.dtype, p.device)]

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        every = self.update_every
        if every and self.host.step % every == 0 and id(optimizer) not in self.stepped:
            tensors = self._watched()
            self._shadow = self._copy_of(tensors) if tensors else None

    def on_post_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._shadow is None:
            return
        host = self.host
        with torch.no_grad():
            torch._foreach_sub_(self._shadow, self._watched())
            deltas = iter(self._shadow)
            full = [next(deltas) if reduces(p.dtype, p.device) else None for p in host.param_tensors]
            self.norms.copy_norms(self.block.start, full, self.norms.sharded)
        # DTensor has no _foreach_copy_: sharded models copy afresh.
        keep = self.copy_bytes <= KEEP_UPDATE_COPY_BYTES and not self.norms.sharded
        self._kept_shadow = self._shadow if keep else None
        self._shadow = None
        host.meta.updates_sampled = True

    def _copy_of(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The weights before the update, for the exact ||dW|| of a sampled step.

        Small models reuse one set of buffers (fresh allocations of a few MB cost page faults on
        every sampled step); above ``KEEP_UPDATE_COPY_BYTES`` the copy is made and dropped each
        time, so the memory is held only between the pre- and post-step hooks.
        """
        kept = self._kept_shadow
        if kept is not None and len(kept) == len(tensors) and all(
            k.shape == t.shape and k.dtype == t.dtype and k.device == t.device for k, t in zip(kept, tensors)
        ):
            torch._foreach_copy_(kept, tensors)
            return kept
        return list(torch._foreach_mul(tensors, 1.0))

    def close(self) -> None:
        self._shadow = None
        self._kept_shadow = None


def _update_norms(record: StepRecord) -> Optional[UpdateNorms]:
    if not record.meta.updates_sampled or not record.has("update_norm"):
        return None
    return UpdateNorms(record.keys("update_norm"), record.array("update_norm").astype(np.float64))
