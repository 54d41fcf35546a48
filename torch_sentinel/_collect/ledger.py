"""Preallocated device slots, one row per optimizer step."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .._record.layout import SlotRange

__all__ = ["FLOAT_MAX", "Ledger", "SlotRange"]

#: Minimum slots start here and maximum slots at -FLOAT_MAX, so an untouched pair stays finite.
FLOAT_MAX = float(torch.finfo(torch.float32).max)


class Ledger:
    """The current step's row of slots on the training device: float32, or float64 once a
    float64 value is recorded (:meth:`fit`), so every statistic keeps its own dtype's range.

    Slots are registered in named blocks. ``views[i]`` is a 0-d view of slot ``i`` that hooks
    reduce into with ``out=``-style ops, so a hook never allocates a buffer or reads a value.
    Blocks may be added after the first step (a module first called late), and the row may
    widen to float64 once; those are the only times its storage is reallocated.
    """

    def __init__(self, device: torch.device, spare: int = 64) -> None:
        self.device = device
        #: float32 until a float64 tensor is recorded; then float64 for good.
        self.dtype = torch.float32
        self.blocks: dict[str, SlotRange] = {}
        self._initial: list[float] = []
        self._spare = spare
        self.width = 0
        self.current = torch.empty(0, dtype=torch.float32, device=device)
        self.initial = self.current
        self.views: list[torch.Tensor] = []
        #: On CPU, a numpy view of ``current``: reading it is a memory load, not a torch op.
        self.host_view: Optional[np.ndarray] = None
        self.generation = 0

    # -- layout ---------------------------------------------------------------------------
    def add_block(self, name: str, keys: list[str], initial: float = 0.0) -> SlotRange:
        if name in self.blocks:
            raise KeyError(f"ledger block {name!r} already exists")
        block = SlotRange(name, len(self._initial), list(keys))
        self._initial.extend([initial] * len(keys))
        self.blocks[name] = block
        if len(self._initial) > self.current.numel():
            self._reallocate(len(self._initial) + self._spare)
        else:
            self.current[block.start : block.stop] = initial
            self.initial[block.start : block.stop] = initial
        self.width = len(self._initial)
        return block

    def add_minmax_block(self, name: str, keys: list[str]) -> tuple[SlotRange, SlotRange]:
        """Two blocks, ``name.min`` and ``name.max``, initialised so untouched slots are finite."""
        lo = self.add_block(f"{name}.min", keys, FLOAT_MAX)
        hi = self.add_block(f"{name}.max", keys, -FLOAT_MAX)
        return lo, hi

    def _reallocate(self, capacity: int) -> None:
        old = self.current
        initial = torch.tensor(
            self._initial + [0.0] * (capacity - len(self._initial)),
            dtype=self.dtype,
            device=self.device,
        )
        current = initial.clone()
        if old.numel():
            current[: old.numel()].copy_(old)
        self.current = current
        self.initial = initial
        self.views = list(current.unbind(0))
        self.host_view = current.numpy() if self.device.type == "cpu" else None
        self.generation += 1

    def fit(self, dtype: torch.dtype) -> None:
        """Make the row able to hold ``dtype``'s values: float64 values (finite up to ~1.8e308)
        would overflow float32 slots (~3.4e38) and read as Inf, so the row widens to float64,
        once. Host bookkeeping plus, the first time only, one reallocation (cold path)."""
        if dtype is torch.float64 and self.dtype is not torch.float64:
            self.dtype = torch.float64
            self._reallocate(self.current.numel())

    # -- per step -------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new row: one device op."""
        self.current.copy_(self.initial)

    def initial_row(self) -> np.ndarray:
        """A host copy of a fresh row (every slot at its initial value), without a device read."""
        row = np.zeros(self.current.numel(), dtype=np.float64 if self.dtype is torch.float64 else np.float32)
        row[: len(self._initial)] = self._initial
        return row

    def block(self, name: str) -> SlotRange:
        return self.blocks[name]
