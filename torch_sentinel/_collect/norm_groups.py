"""Helpers of the norms probe: gradients as dense tensors, and norms of many small tensors of
one shape taken as one stacked reduction on CPU."""

from __future__ import annotations

import operator
from typing import Optional

import torch

from .compat import sparse_values

__all__ = ["GroupPlan", "dense_grads"]

#: Tensors up to this many elements are normed in stacked groups of one shape on CPU (far
#: below the 32,768-element grain at which a CPU reduction is split across threads).
_GROUP_MAX_NUMEL = 1024
#: A group smaller than this is left to _foreach_norm (a stack costs a few norms' dispatch).
_GROUP_MIN = 4


class GroupPlan:
    """Which tensors of a fixed list of shapes go to _foreach_norm and which are stacked, by shape."""

    def __init__(self, sizes: tuple[torch.Size, ...], device: torch.device) -> None:
        self.sizes = sizes
        by_shape: dict[torch.Size, list[int]] = {}
        for i, shape in enumerate(sizes):
            if 0 < shape.numel() <= _GROUP_MAX_NUMEL:
                by_shape.setdefault(shape, []).append(i)
        grouped = {i for members in by_shape.values() if len(members) >= _GROUP_MIN for i in members}
        self.big = [i for i in range(len(sizes)) if i not in grouped]
        self.big_index = torch.tensor(self.big, dtype=torch.long, device=device)
        self.groups = [(members, torch.tensor(members, dtype=torch.long, device=device))
                       for members in by_shape.values() if len(members) >= _GROUP_MIN]

    def run(self, tensors: list[torch.Tensor], dest: torch.Tensor) -> None:
        if self.big:
            norms = torch.stack(torch._foreach_norm([tensors[i] for i in self.big]))
            dest.index_copy_(0, self.big_index, norms.to(dest.dtype))
        for members, index in self.groups:
            rows = torch.stack([tensors[i] for i in members]).view(len(members), -1)
            dest.index_copy_(0, index, torch.linalg.vector_norm(rows, dim=1).to(dest.dtype))


_GRAD = operator.attrgetter("grad")
_IS_SPARSE = operator.attrgetter("is_sparse")


def dense_grads(params: list[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """The ``.grad`` of each parameter, sparse ones as their values (see :func:`_dense`)."""
    grads: list[Optional[torch.Tensor]] = list(map(_GRAD, params))
    present = [g for g in grads if g is not None]
    if any(map(_IS_SPARSE, present)):
        return [_dense(g) for g in grads]
    return grads


def _dense(grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The values of a sparse gradient (``nn.Embedding(sparse=True)``), whose L2 norm is the
    gradient's: ``_foreach_norm`` takes dense tensors only. Coalescing sums the entries of
    repeated indices first; it runs only for sparse gradients."""
    if grad is not None and grad.is_sparse:
        return sparse_values(grad)
    return grad
