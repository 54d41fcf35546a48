"""Norms of sharded parameters (FSDP2 ``fully_shard``, DTensor): local shards, global answers.

Each rank holds a shard of a sharded parameter (and of its gradient). The norm of the whole
tensor is ``sqrt(sum over shards of ||shard||^2)``, so the collector takes the norms of the local
shards in its one ``_foreach_norm`` and then sums the squares over the mesh dimensions along
which the tensor is sharded (replicated dimensions are left alone: summing them would count the
same values twice). The sum is one ``all_reduce`` per distinct set of groups, enqueued on the
device like any collective; the host never waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist

__all__ = ["ShardedNorms", "local"]

try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Shard
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]
    Shard = None  # type: ignore[assignment,misc]


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor; any other tensor as it is."""
    if DTensor is not None and isinstance(t, DTensor):
        return t.to_local()
    return t


def _shard_groups(t: torch.Tensor) -> Optional[tuple[Any, ...]]:
    """The process groups of the mesh dimensions along which ``t`` is sharded, or None."""
    if DTensor is None or not isinstance(t, DTensor):
        return None
    mesh = t.device_mesh
    groups = tuple(mesh.get_group(i) for i, p in enumerate(t.placements) if isinstance(p, Shard))
    return groups or None


class ShardedNorms:
    """Which of a fixed list of parameters are sharded, grouped by the process groups to sum over."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        by_groups: dict[tuple[int, ...], tuple[tuple[Any, ...], list[int]]] = {}
        for i, p in enumerate(params):
            groups = _shard_groups(p)
            if groups is not None:
                key = tuple(id(g) for g in groups)
                by_groups.setdefault(key, (groups, []))[1].append(i)
        self._groups = list(by_groups.values())
        self._sharded = {i for _, idx in self._groups for i in idx}

    def __bool__(self) -> bool:
        return bool(self._groups)

    def globalize(self, norms: torch.Tensor, present: Sequence[int]) -> torch.Tensor:
        """``norms[k]`` is the local norm of parameter ``present[k]``; returns global norms.

        Every rank must call this with the same ``present`` (collectives must match); under
        FSDP the same parameters have gradients on every rank.
        """
        if not self._groups:
            return norms
        pos = {p: k for k, p in enumerate(present)}
        out = norms.clone()
        for groups, indices in self._groups:
            ks = [pos[i] for i in indices if i in pos]
            if not ks:
                continue
            index = torch.tensor(ks, device=norms.device)
            squares = norms.index_select(0, index).double().square()
            for group in groups:
                dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)
            out.index_copy_(0, index, squares.sqrt().to(norms.dtype))
        return out
