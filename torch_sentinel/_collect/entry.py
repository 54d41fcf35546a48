"""Data entry: which tensors arriving at the model are its data, and the ``on_data`` event.

Data enters through two doors:

- the attached model's own forward: every floating tensor of the call is data (the first
  positional one, or the first non-mask keyword one, is the batch);
- a top-level submodule called from user code, outside the model's forward (Lightning's
  ``training_step`` calling ``self.discriminator(imgs)``, where the container's forward is never
  called): its inputs are data only when they come from outside the graph (no ``grad_fn``: a
  batch, noise, a detached tensor). A tensor computed from a module's output (``d(g(z))``) is
  not: the forward checks already locate a fault there.

The collector tells :class:`DataEntry` when the root's forward starts and ends
(:meth:`DataEntry.root_entered` / :meth:`DataEntry.root_exited`), so a submodule called from
inside it is not taken for a door.

The second door's pre-hooks are on the steps where every module is hooked (``watching.py``):
on ordinary steps of a model whose loop calls the root, they would only cost a Python call per
top-level submodule (every layer of an ``nn.Sequential``); a loop that calls submodules itself
keeps every hook on every step.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._errors import raised_at_entry
from .compat import is_compiling as _is_compiling
from .hookset import ModuleHook
from .schedule import ProbeTable
from .tensors import iter_tensors, reducible

__all__ = ["DataEntry", "EntryHost"]


class EntryHost(Protocol):
    """What data entry needs of the collector."""

    #: Set at detach: no event is delivered any more.
    disabled: bool

    def drain_landed(self) -> None:
        """Hand on rows that already reached the host (never blocks)."""
        ...


class DataEntry:
    """Delivers ``on_data`` for the model's inputs and for data entering a top-level submodule.

    Args:
        host: the collector (its ``disabled`` flag and ``drain_landed``).
        table: the probe table whose ``on_data`` subscribers receive the tensors.
    """

    def __init__(self, host: EntryHost, table: ProbeTable) -> None:
        self._host = host
        # The list itself: the table adds and removes subscribers in place.
        self._on_data: list[Callable[..., None]] = table.subs["on_data"]
        self._emit = table.emit
        #: Calls of the root's forward in progress (its submodules' inputs are then not data).
        self.depth = 0
        #: The top-level submodules and, while the second door is watched, their pre-hooks.
        self._children: list[nn.Module] = []
        self._handles: list[RemovableHandle] = []

    def install(self, root: nn.Module) -> None:
        """Watch what user code passes to each top-level submodule of ``root``."""
        self._children = list(root.children())
        self.set_active(True)

    def watch(self, old: nn.Module, new: nn.Module) -> None:
        """``new`` replaced the top-level submodule ``old``: watch it instead."""
        self._children = [new if c is old else c for c in self._children]
        if self._handles:
            self.set_active(False)
            self.set_active(True)

    def set_active(self, active: bool) -> None:
        """Hook the top-level submodules (or unhook them); between steps."""
        if active and not self._handles:
            self._handles = [c.register_forward_pre_hook(ModuleHook(raised_at_entry, self.on_entry), with_kwargs=True)
                             for c in self._children]
        elif not active:
            self.close()

    def close(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def root_entered(self) -> None:
        self.depth += 1

    def root_exited(self) -> None:
        self.depth = max(self.depth - 1, 0)

    def on_entry(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A top-level submodule was called; outside the root's forward, its outside inputs are data."""
        if self.depth or self._host.disabled or not torch.is_grad_enabled():
            return None
        compiling = _is_compiling()
        if not compiling:
            self._host.drain_landed()
        self.emit(args, kwargs, compiling, from_outside=True)
        return None

    def emit(self, args: tuple[Any, ...], kwargs: dict[str, Any], compiling: bool,
             from_outside: bool = False) -> None:
        """Deliver each reducible tensor of a call as data; ``from_outside`` skips graph tensors."""
        on_data = self._on_data
        first = True
        for t in iter_tensors(args):
            if reducible(t) and not (from_outside and t.grad_fn is not None):
                self._emit(on_data, t, first, None, compiling)
                first = False
        for key, value in kwargs.items():
            for t in iter_tensors(value):
                if not reducible(t) or (from_outside and t.grad_fn is not None):
                    continue
                # A 0-d tensor is a count or a flag (the HF Trainer's num_items_in_batch), not the batch.
                main = first and "mask" not in key and t.dim() > 0
                self._emit(on_data, t, main, key, compiling)
                first = first and not main
