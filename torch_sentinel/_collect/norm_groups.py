"""Helpers of the norms probe and the spike ring: gradients as dense tensors, and norms of many
small tensors of one shape taken as one stacked reduction on CPU."""

from __future__ import annotations

import operator
from collections.abc import Hashable
from typing import Literal, Optional, Union

import torch

from . import batch
from .compat import sparse_values

__all__ = ["GroupPlan", "GroupedCopy", "Order", "Stacks", "dense_grads", "grouped_norms", "groups_on"]

#: A norm's order, or ``"sum"``: the L1 norm of tensors that hold no negative value (Adam's
#: ``exp_avg_sq``), taken as a plain sum. On CPU a row-wise ``vector_norm`` of order 1 runs
#: about ten times slower than a row-wise sum (102 us against 8 us over 250 rows of 1,366
#: elements on the 2-core machine); a per-tensor ``_foreach_norm`` is as fast at either order.
Order = Union[float, Literal["sum"]]

#: Tensors up to this many elements are normed in stacked groups of one shape on CPU (below
#: the 32,768-element grain at which a CPU reduction is split across threads, so a row's norm
#: is bit for bit the whole tensor's). Measured on the 2-core CPU: ten 4,096-element tensors
#: 25 us one by one, 14 us stacked; at 16,384 elements the copy costs more than it saves.
_GROUP_MAX_NUMEL = 4096
#: A group smaller than this is left to _foreach_norm: a group costs three ops (stack, norm,
#: index_copy_) where the loop inside one _foreach_norm is one, and under eight members the
#: time it saves on CPU (4 us for four 4,096-element tensors) does not pay for them.
_GROUP_MIN = 8

#: Stacks already made of some groups' members, by the members' positions in the list normed: a
#: group whose members are the same tensors is normed from its stack instead of stacked again.
Stacks = dict[tuple[int, ...], torch.Tensor]


def groups_on(device: torch.device) -> bool:
    """Whether small tensors on ``device`` are reduced in stacked groups: on CPU, where the
    per-op strategy is in use. Accelerators (and ``batch.FUSED_ON_CPU``, the launch-count
    tests) count kernel launches: there one ``_foreach_norm`` is one launch."""
    return device.type == "cpu" and not batch.FUSED_ON_CPU


class GroupPlan:
    """Which tensors of a fixed list of shapes go to _foreach_norm and which are stacked, by shape.

    The norms are written into a scratch vector in plan order (the ``_foreach_norm`` ones, then
    each group's rows), through views made once, and reach ``dest`` in one op: a copy when plan
    order is ``dest``'s, else one ``index_copy_`` (two groups: four ops, where a scatter per
    group made six)."""

    def __init__(self, sizes: tuple[torch.Size, ...], device: torch.device) -> None:
        self.sizes = sizes
        stacked = batch.small_groups(sizes, [shape.numel() for shape in sizes], _GROUP_MAX_NUMEL, _GROUP_MIN)
        grouped = {i for members in stacked for i in members}
        self.big = [i for i in range(len(sizes)) if i not in grouped]
        self.groups: list[list[int]] = stacked
        self._keys = [tuple(members) for members in stacked]
        order = self.big + [i for members in stacked for i in members]
        self._in_order = order == list(range(len(sizes)))
        self._order = torch.tensor(order, dtype=torch.long, device=device)
        self._scratch = torch.empty(len(sizes), dtype=torch.float32, device=device)
        self._big_out = self._scratch[: len(self.big)]
        self._group_outs = []
        at = len(self.big)
        for members in stacked:
            self._group_outs.append(self._scratch[at : at + len(members)])
            at += len(members)

    def run(self, tensors: list[torch.Tensor], dest: torch.Tensor, ord: Order = 2.0,
            stacked: Optional[Stacks] = None) -> None:
        """Norms of ``tensors`` into ``dest``; a group found in ``stacked`` is not stacked again."""
        made = stacked or {}
        stacks = [made[key] if key in made else torch.stack([tensors[i] for i in members])
                  for key, members in zip(self._keys, self.groups)]
        self.write([tensors[i] for i in self.big], stacks, dest, ord)

    def write(self, big: list[torch.Tensor], stacks: list[torch.Tensor], dest: torch.Tensor, ord: Order) -> None:
        """``ord``-norms (or sums) of float32 tensors into ``dest``: of ``big`` (the tensors at
        ``self.big``) one by one, and of the rows of ``stacks`` (one per group, its members
        stacked in order)."""
        if big:
            torch.stack(torch._foreach_norm(big, 1 if ord == "sum" else ord), out=self._big_out)
        for out, rows in zip(self._group_outs, stacks):
            # Over every dim but the first: a row's norm without a view op to flatten it.
            dims = tuple(range(1, rows.dim()))
            if ord == "sum":
                torch.sum(rows, dim=dims, out=out)
            else:
                torch.linalg.vector_norm(rows, ord, dim=dims, out=out)
        norms = self._scratch if dest.dtype is torch.float32 else self._scratch.to(dest.dtype)
        if self._in_order:
            dest.copy_(norms)
        else:
            dest.index_copy_(0, self._order, norms)


def grouped_norms(plans: dict[Hashable, GroupPlan], key: Hashable, tensors: list[torch.Tensor],
                  dest: torch.Tensor, ord: Order = 2.0, stacked: Optional[Stacks] = None) -> None:
    """``ord``-norms of CPU ``tensors`` into the 1-d ``dest``, through the plan kept in ``plans``
    under ``key``. Shapes are not scanned every step: a row's norm is the flattened tensor's
    whatever its shape, and a group that no longer stacks (a tensor resized through ``.data``)
    is planned again. ``stacked``: groups already stacked (:meth:`GroupedCopy.changed`)."""
    plan = plans.get(key)
    if plan is None or len(plan.sizes) != len(tensors):
        plan = plans[key] = GroupPlan(tuple(map(_SHAPE, tensors)), dest.device)
    try:
        plan.run(tensors, dest, ord, stacked)
    except RuntimeError:
        plan = plans[key] = GroupPlan(tuple(map(_SHAPE, tensors)), dest.device)
        plan.run(tensors, dest, ord)


class GroupedCopy:
    """A copy of a fixed list of small CPU tensors, to take the norm of what changed since.

    Tensors of one shape are copied as the rows of one stacked buffer (one ``stack`` per shape
    where ``_foreach_copy_`` dispatches once per tensor), the others one by one. ``changed``
    subtracts the tensors' current values from the copy and writes each one's ``ord``-norm of
    the difference: the same values as per tensor (rows of at most ``_GROUP_MAX_NUMEL``).

    ``whole``: per tensor, whether it is a whole tensor that is also normed for itself (the spike
    ring's weights, where the copy is of the weights and not of a sample of them): ``changed``
    returns the stacks of the groups made of such tensors only, so their norms need no second
    stack. On CPU a stack of many small tensors is the costly part (on a stack of 250 64x64
    weights, about 0.4 ms a step in a training step's cold cache).
    """

    def __init__(self, tensors: list[torch.Tensor], whole: Optional[list[bool]] = None) -> None:
        self.plan = plan = GroupPlan(tuple(map(_SHAPE, tensors)), tensors[0].device)
        self._rows = [operator.itemgetter(*members) for members in plan.groups]
        self._big = [tensors[i].detach().clone(memory_format=torch.contiguous_format) for i in plan.big]
        self._buffers = [torch.stack(rows(tensors)) for rows in self._rows]
        #: Per group, its members as a ``Stacks`` key where every one is whole, else None.
        self._shared = [tuple(members) if whole is not None and all(whole[i] for i in members) else None
                        for members in plan.groups]

    def fits(self, tensors: list[torch.Tensor]) -> bool:
        """Whether each group's first member still has its buffer's row shape: one look a group
        (a parameter reshaped through ``.data`` keeps its size and address). A group whose
        members no longer share a shape makes the stack raise."""
        return all(buffer.shape[1:] == tensors[members[0]].shape
                   for members, buffer in zip(self.plan.groups, self._buffers))

    def copy(self, tensors: list[torch.Tensor]) -> None:
        """Copy ``tensors`` (the same shapes, in the same order, as at construction)."""
        for rows, buffer in zip(self._rows, self._buffers):
            torch.stack(rows(tensors), out=buffer)
        if self._big:
            torch._foreach_copy_(self._big, [tensors[i] for i in self.plan.big])

    def changed(self, tensors: list[torch.Tensor], dest: torch.Tensor, ord: float = 2.0) -> Stacks:
        """``ord``-norms of (copy - ``tensors``) into the 1-d ``dest``; the copy is spent.
        Returns the stacks of ``tensors``' current values of the groups of whole tensors."""
        if self._big:
            torch._foreach_sub_(self._big, [tensors[i] for i in self.plan.big])
        shared: Stacks = {}
        for rows, buffer, key in zip(self._rows, self._buffers, self._shared):
            now = torch.stack(rows(tensors))
            buffer.sub_(now)
            if key is not None:
                shared[key] = now
        self.plan.write(self._big, self._buffers, dest, ord)
        return shared


_SHAPE = operator.attrgetter("shape")
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
