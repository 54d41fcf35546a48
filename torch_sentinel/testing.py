"""Tools for auditing your own loop: count the device→host reads it makes.

    with torch_sentinel.testing.count_host_syncs() as syncs:
        train_step()
    assert syncs.count == 0

On CPU every tensor is already on the host, so "sync" means an op that *would* force a
device→host read on an accelerator: a TorchDispatchMode counts them. On CUDA, use
:func:`cuda_sync_guard`, which makes any synchronising call raise.

:func:`count_launches` counts the ops that launch device work (on CPU too, where each one
would be one or more kernel launches on a GPU): views, ``detach`` and allocations are left
out, since they only touch metadata; :class:`ViewCounter` counts those views (each one still a
dispatcher call).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter", "LaunchCounter", "ViewCounter", "count_host_syncs", "count_launches",
           "cuda_sync_guard"]

_aten = torch.ops.aten

#: Ops whose result size or value must be known on the host: each is a device→host read.
SYNC_OPS = frozenset(
    op
    for op in (
        getattr(_aten._local_scalar_dense, "default", None),
        getattr(_aten.nonzero, "default", None),
        getattr(_aten.is_nonzero, "default", None),
        getattr(_aten.equal, "default", None),
        getattr(_aten.masked_select, "default", None),
        getattr(_aten.unique_consecutive, "default", None),
        getattr(_aten._unique2, "default", None),
        getattr(_aten.item, "default", None),
    )
    if op is not None
)


def _bool_indexing(func: Any, args: tuple[Any, ...]) -> bool:
    """Indexing with a boolean mask (``x[mask]``) needs the count of True values on the host."""
    if func not in (_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


class _OpCounter(TorchDispatchMode):
    """Counts the dispatched ops that :meth:`counts` selects, by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def counts(self, func: Any, args: tuple[Any, ...]) -> bool:
        raise NotImplementedError

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if self.counts(func, args):
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


class HostSyncCounter(_OpCounter):
    """Counts ops that force a device→host read, by op name."""

    def counts(self, func: Any, args: tuple[Any, ...]) -> bool:
        return func in SYNC_OPS or _bool_indexing(func, args)


@contextlib.contextmanager
def count_host_syncs() -> Iterator[HostSyncCounter]:
    """Count device→host reads made inside the block (see :class:`HostSyncCounter`)."""
    counter = HostSyncCounter()
    with counter:
        yield counter


#: Ops that allocate or alias without computing anything: no kernel on a GPU.
_NO_LAUNCH = frozenset(
    op
    for op in (
        getattr(_aten.empty, "memory_format", None),
        getattr(_aten.empty_strided, "default", None),
        getattr(_aten.empty_like, "default", None),
        getattr(_aten.resize_, "default", None),
        getattr(_aten.set_, "source_Storage_storage_offset", None),
        getattr(_aten._local_scalar_dense, "default", None),  # a host read: see count_host_syncs
    )
    if op is not None
)


class LaunchCounter(_OpCounter):
    """Counts the ops that launch device work, by op name (views, ``detach`` and allocations
    are metadata-only and not counted). A ``torch._foreach_*`` op counts once, as it runs as a
    few multi-tensor kernels on CUDA whatever the list's length."""

    def counts(self, func: Any, args: tuple[Any, ...]) -> bool:
        return not func.is_view and func not in _NO_LAUNCH


class ViewCounter(_OpCounter):
    """Counts the view ops, by op name: what :class:`LaunchCounter` leaves out as metadata-only,
    yet one dispatcher call each."""

    def counts(self, func: Any, args: tuple[Any, ...]) -> bool:
        return bool(func.is_view)


@contextlib.contextmanager
def count_launches() -> Iterator[LaunchCounter]:
    """Count the device-work-launching ops dispatched inside the block (see :class:`LaunchCounter`)."""
    counter = LaunchCounter()
    with counter:
        yield counter


@contextlib.contextmanager
def cuda_sync_guard(mode: str = "error") -> Iterator[None]:
    """Make every synchronising CUDA call inside the block raise (or warn, with mode="warn")."""
    if not torch.cuda.is_available():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
