"""Batched reductions: hooks record what to reduce; one multi-tensor reduction per boundary.

On the hot path a module's forward hook (or an output-gradient hook) does not launch anything:
it appends ``(tensor, slots)`` to a pending list. At the next boundary (the root's forward
returns, ``backward()`` returns, the optimizer is about to step, the row closes) or when the
list reaches ``cap`` tensors, the whole list is reduced at once:

- one ``torch._foreach_norm(tensors, inf)`` per dtype: the largest ``|x|`` of each tensor
  (NaN if any NaN, +inf if any ±Inf), one multi-tensor launch;
- one ``torch.stack``, one ``neg`` and two ``scatter_reduce_`` into the row: ``|x|max`` folded
  into the ``max`` slot (``amax``), ``-|x|max`` into the ``min`` slot (``amin``), so a module
  called twice, gradient accumulation and duplicates within one batch fold on the device.

A (min, max) pair written here is therefore symmetric (``-m``, ``m``): every consumer of these
blocks reads ``max(|min|, |max|)`` and "touched" as ``max >= min``, which the pair keeps.

The cap bounds what is held: at most ``cap`` activations or gradients outlive their hook, and
none outlives the boundary that follows (so none outlives its step). In immediate mode the
flushed values are read back (a numpy view on CPU) and, only when one is non-finite, the first
non-finite entry in recording order (forward order in forward, backward order in backward) is
handed to its probe's localisation callback with the tensor itself: the per-tensor results of
the batched op are per module, so localisation stays exact.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch

from .dtypes import DtypePolicy
from .ledger import Ledger
from .transfer import read_now

__all__ = ["BatchedMax"]

#: Called with the offending tensor when its batched result is non-finite (immediate mode).
OnBad = Callable[[torch.Tensor], None]

_INF = math.inf
_CACHE_LIMIT = 512


class BatchedMax:
    """The pending ``(tensor, min slot, max slot)`` entries of the current boundary."""

    def __init__(self, ledger: Ledger, dtypes: DtypePolicy, cap: int = 64) -> None:
        self.ledger = ledger
        self.dtypes = dtypes
        self.cap = cap
        self.immediate = False
        self._tensors: list[torch.Tensor] = []
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._on_bad: list[Optional[OnBad]] = []
        #: Device index tensors by slot tuple: the same pattern recurs every step.
        self._index: dict[tuple[int, ...], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._tensors)

    def add(self, t: torch.Tensor, lo: int, hi: int, probe: str, on_bad: Optional[OnBad],
            written: set[int]) -> None:
        """Record ``t`` for the slot pair ``(lo, hi)``; host bookkeeping only, unless the list
        is full (then the pending entries are reduced first)."""
        d = t.detach()
        if d.dtype is not self.ledger.dtype and not self.dtypes.admit(d, False, probe):
            return
        if len(self._tensors) >= self.cap:
            self.flush(written)
        self._tensors.append(d)
        self._lo.append(lo)
        self._hi.append(hi)
        self._on_bad.append(on_bad)

    def drop(self) -> None:
        """Forget the pending entries (an abandoned row, detach)."""
        self._tensors, self._lo, self._hi, self._on_bad = [], [], [], []

    def flush(self, written: set[int]) -> None:
        """Reduce every pending entry into the row; in immediate mode, localise a non-finite one."""
        if not self._tensors:
            return
        tensors, lo, hi, on_bad = self._tensors, self._lo, self._hi, self._on_bad
        self.drop()  # first: a raise below must leave a clean list
        row = self.ledger.current
        dtype = row.dtype
        first = tensors[0].dtype
        if all(t.dtype is first for t in tensors):
            groups = [list(range(len(tensors)))]
        else:  # autocast: fp16/bf16 and float32 outputs in one forward
            by: dict[torch.dtype, list[int]] = {}
            for i, t in enumerate(tensors):
                by.setdefault(t.dtype, []).append(i)
            groups = list(by.values())
        results: list[tuple[list[int], torch.Tensor]] = []
        for idx in groups:
            group = [tensors[i] for i in idx] if len(groups) > 1 else tensors
            m = torch.stack(torch._foreach_norm(group, _INF))
            if m.dtype is not dtype:
                m = m.to(dtype)
            g_lo = [lo[i] for i in idx] if len(groups) > 1 else lo
            g_hi = [hi[i] for i in idx] if len(groups) > 1 else hi
            self._write(row, m, g_lo, g_hi, written)
            results.append((idx, m))
        if self.immediate:
            self._check(results, tensors, on_bad)

    def _write(self, row: torch.Tensor, m: torch.Tensor, lo: list[int], hi: list[int], written: set[int]) -> None:
        # scatter_reduce folds with what the slots hold (a module called twice, gradient
        # accumulation) and between duplicates in one batch; amax/amin propagate NaN on every
        # backend (pytorch#75651).
        row.scatter_reduce_(0, self._indices(hi), m, "amax")
        row.scatter_reduce_(0, self._indices(lo), m.neg(), "amin")
        written.update(lo)

    def _indices(self, slots: list[int]) -> torch.Tensor:
        key = tuple(slots)
        index = self._index.get(key)
        if index is None:
            if len(self._index) >= _CACHE_LIMIT:
                self._index.clear()
            index = torch.tensor(key, dtype=torch.long)
            if self.ledger.device.type != "cpu":
                index = index.to(self.ledger.device, non_blocking=True)
            self._index[key] = index
        return index

    def _check(self, results: list[tuple[list[int], torch.Tensor]], tensors: list[torch.Tensor],
               on_bad: list[Optional[OnBad]]) -> None:
        bad: list[int] = []
        for idx, m in results:
            if m.device.type == "cpu":
                values = m.numpy()  # a view: a memory load, no torch op
                if np.isfinite(values).all():
                    continue
            elif read_now(torch.isfinite(m).all()):
                continue
            else:
                values = m.cpu().numpy()  # cold path: something is non-finite
            bad.extend(idx[j] for j in np.flatnonzero(~np.isfinite(values)).tolist())
        for i in sorted(bad):  # recording order: forward order in forward, backward order in backward
            callback = on_bad[i]
            if callback is not None:
                callback(tensors[i])
