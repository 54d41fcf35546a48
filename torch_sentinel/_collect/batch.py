"""Batched reductions: hooks record what to reduce; the device work runs once per boundary.

On the hot path a module's forward hook (or an output-gradient hook) launches nothing: it
appends ``(tensor, slots)`` to a pending list. At the next boundary (the root's forward
returns, ``backward()`` returns, the optimizer is about to step, the row closes) or when the
list reaches ``cap`` tensors, the whole list is reduced. Two strategies, by device:

- **fused** (accelerators, where the cost is counted in kernel launches): one
  ``torch._foreach_norm(tensors, inf)`` per (device, dtype) group gives the largest ``|x|`` of
  each tensor (NaN if any NaN, +inf if any ±Inf) in one multi-tensor launch, then one
  ``torch.stack``, one ``neg`` and two ``scatter_reduce_`` fold ``|x|max`` into the ``max``
  slots (``amax``) and ``-|x|max`` into the ``min`` slots (``amin``): five launches per
  boundary however many modules ran. amax/amin propagate NaN on every backend (pytorch#75651),
  and fold a module called twice, gradient accumulation and duplicates within one batch. The
  pair written is symmetric (``-m``, ``m``): every consumer of these blocks reads
  ``max(|min|, |max|)`` and "touched" as ``max >= min``, which it keeps.
- **loop** (CPU, where there are no launches to save and torch's CPU ``_foreach`` kernels loop
  over the tensors anyway, 4-6x slower than ``aminmax`` for an inf-norm): one ``aminmax`` per
  tensor at the boundary, into the pair, true min and max (as before batching); small tensors
  of one shape, four or more, as the rows of one stack (one ``aminmax`` over the rows).

:class:`BatchedFractions` does the same for the saturation probe's fractions (sampled steps).

Both are the collector's (``Collector.batch``, ``Collector.fractions``): its ``flush_pending``
reduces both at each boundary, its ``drop_pending`` forgets both when the row is abandoned, the
model's forward raises (what a failed forward recorded is neither charged to the batch that
runs next nor kept alive) or the sentinel detaches. Probes only record (``reduce_later``,
``fraction_later``). The cap bounds what is held: at most ``cap`` activations or gradients
outlive their hook, and none outlives the boundary that follows (so none outlives its step). In immediate mode the
results are read back (a numpy view on CPU) and, only when one is non-finite, the first
non-finite entry in recording order (forward order in forward, backward order in backward) is
handed to its probe's localisation callback with the tensor itself: the per-tensor results
are per module, so localisation stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any, Callable, Optional

import numpy as np
import torch

from .dtypes import DtypePolicy
from .ledger import Ledger
from .transfer import read_now

__all__ = ["FUSED_ON_CPU", "BatchedFractions", "BatchedMax", "small_groups"]

#: Called with the offending tensor when its batched result is non-finite (immediate mode).
OnBad = Callable[[torch.Tensor], None]

_INF = math.inf
#: Use the fused strategy on CPU too (the launch-count test measures the accelerator path so).
FUSED_ON_CPU = False
_CACHE_LIMIT = 512
#: The loop strategy reduces tensors of one (dtype, shape) up to this many elements as the rows
#: of one stack when at least ``_STACK_MIN`` share it: four ops (stack, aminmax over the rows,
#: two scatter_reduce_) where one ``aminmax`` each costs a dispatch per tensor. On an HF GPT-2
#: the output gradients of its custom blocks are 35 tensors of three shapes a step.
_STACK_MAX_NUMEL = 1 << 14
_STACK_MIN = 4


def small_groups(keys: Sequence[Hashable], numels: Sequence[int], max_numel: int, min_members: int) -> list[list[int]]:
    """Positions of the entries that can be stacked together: those with one key (a shape, with
    the dtype and device where they vary), of 1 to ``max_numel`` elements, in groups of at least
    ``min_members``, each in order. Shared by the batched checks and ``norm_groups``."""
    by: dict[Hashable, list[int]] = {}
    for i, (key, n) in enumerate(zip(keys, numels)):
        if 0 < n <= max_numel:
            by.setdefault(key, []).append(i)
    return [members for members in by.values() if len(members) >= min_members]


def _stack_groups(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of the tensors reduced together: those of one dtype, device and shape (small,
    and at least ``_STACK_MIN`` of them)."""
    if len(tensors) < _STACK_MIN:
        return []
    return small_groups([(t.dtype, t.device, t.shape) for t in tensors], [t.numel() for t in tensors],
                        _STACK_MAX_NUMEL, _STACK_MIN)


class SlotIndex:
    """Device index tensors by slot tuple, made once: the same pattern recurs every step."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, slots: list[int], device: torch.device) -> torch.Tensor:
        key = tuple(slots)
        index = self._cache.get(key)
        if index is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            index = torch.tensor(key, dtype=torch.long)
            if device.type != "cpu":
                index = index.to(device, non_blocking=True)
            self._cache[key] = index
        return index


class BatchedMax:
    """The pending ``(tensor, min slot, max slot)`` entries of the current boundary."""

    def __init__(self, ledger: Ledger, dtypes: DtypePolicy, cap: int = 64, fused: Optional[bool] = None) -> None:
        self.ledger = ledger
        #: The multi-tensor strategy (default: on accelerators; see the module docstring).
        self.fused = (ledger.device.type != "cpu" or FUSED_ON_CPU) if fused is None else fused
        self.dtypes = dtypes
        self.cap = cap
        self.immediate = False
        self._tensors: list[torch.Tensor] = []
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._on_bad: list[Optional[OnBad]] = []
        #: Device index tensors by slot tuple: the same pattern recurs every step.
        self._index = SlotIndex()

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
        if self.fused:
            self._fused(tensors, lo, hi, on_bad, written)
        else:
            self._loop(tensors, lo, hi, on_bad, written)

    def _loop(self, tensors: list[torch.Tensor], lo: list[int], hi: list[int],
              on_bad: list[Optional[OnBad]], written: set[int]) -> None:
        ledger = self.ledger
        views, dtype = ledger.views, ledger.dtype
        stacked = _stack_groups(tensors)
        #: Each stacked entry's group result and row in it; on CPU as numpy views (read once a
        #: group, memory loads), elsewhere as tensors.
        grouped: dict[int, tuple[Any, Any, int]] = {}
        row = ledger.current
        for members in stacked:
            x = torch.stack([tensors[i] for i in members]).view(len(members), -1)
            mins, maxs = torch.aminmax(x, dim=1)
            if mins.dtype is not row.dtype:
                mins, maxs = mins.to(row.dtype), maxs.to(row.dtype)
            # amin/amax fold with what the slots hold (their initial values are neutral) and
            # between duplicates, a module called twice.
            row.scatter_reduce_(0, self._index([lo[i] for i in members], row.device), mins, "amin")
            row.scatter_reduce_(0, self._index([hi[i] for i in members], row.device), maxs, "amax")
            lows, highs = (mins.numpy(), maxs.numpy()) if mins.device.type == "cpu" else (mins, maxs)
            grouped.update((i, (lows, highs, j)) for j, i in enumerate(members))
            written.update(lo[i] for i in members)
        for i, (t, a, b) in enumerate(zip(tensors, lo, hi)):
            if i in grouped:
                continue
            if t.dtype is dtype and a not in written:
                written.add(a)
                torch.aminmax(t, out=(views[a], views[b]))
            else:
                mn, mx = torch.aminmax(t)
                torch.minimum(views[a], mn, out=views[a])
                torch.maximum(views[b], mx, out=views[b])
        if self.immediate:
            self._check_each(tensors, lo, hi, on_bad, grouped)

    def _check_each(self, tensors: list[torch.Tensor], lo: list[int], hi: list[int],
                    on_bad: list[Optional[OnBad]], grouped: dict[int, tuple[Any, Any, int]]) -> None:
        """Immediate mode, after :meth:`_loop`: each entry's range, in recording order, from its
        group's result or from its slots (on CPU both are memory loads, not device reads)."""
        views, hv = self.ledger.views, self.ledger.host_view
        for i, (t, a, b, bad) in enumerate(zip(tensors, lo, hi, on_bad)):
            if bad is None:
                continue
            group = grouped.get(i)
            if group is not None:
                lows, highs, j = group
                if isinstance(lows, np.ndarray):  # memory loads, no torch op
                    low, high = float(lows[j]), float(highs[j])
                else:
                    low, high = read_now(lows[j]), read_now(highs[j])
            elif hv is not None:
                low, high = hv[a], hv[b]
            else:
                low, high = read_now(views[a]), read_now(views[b])
            if not (math.isfinite(low) and math.isfinite(high)):
                bad(t)

    def _fused(self, tensors: list[torch.Tensor], lo: list[int], hi: list[int],
               on_bad: list[Optional[OnBad]], written: set[int]) -> None:
        row = self.ledger.current
        first = tensors[0]
        if all(t.dtype is first.dtype and t.device == first.device for t in tensors):
            groups = [list(range(len(tensors)))]
        else:  # autocast (fp16/bf16 next to float32), or a model split over devices
            by: dict[tuple[torch.dtype, torch.device], list[int]] = {}
            for i, t in enumerate(tensors):
                by.setdefault((t.dtype, t.device), []).append(i)
            groups = list(by.values())
        results: list[tuple[list[int], torch.Tensor]] = []
        for idx in groups:
            whole = len(groups) == 1
            m = torch.stack(torch._foreach_norm(tensors if whole else [tensors[i] for i in idx], _INF))
            if m.dtype is not row.dtype or m.device != row.device:
                m = m.to(row.device, row.dtype, non_blocking=True)
            # scatter_reduce_ folds with what the slots hold and between duplicates.
            row.scatter_reduce_(0, self._index(hi if whole else [hi[i] for i in idx], self.ledger.device), m, "amax")
            row.scatter_reduce_(0, self._index(lo if whole else [lo[i] for i in idx], self.ledger.device), m.neg(), "amin")
            results.append((idx, m))
        written.update(lo)
        if self.immediate:
            self._check(results, tensors, on_bad)

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


#: Tensors up to this many elements are stacked with their group at the boundary; above it the
#: per-call cost is the data's, not the call's, and they are reduced on the spot.
_SMALL = 1 << 16


class BatchedFractions:
    """Per slot, the fraction of a tensor's values ``v`` with ``|v - shift| > edge``, written at
    the next :meth:`flush` (sigmoid / tanh saturation on sampled steps).

    Reduced one by one, each small tensor costs five ops (shift, abs, compare, cast, mean) and
    a copy: 40-90 µs for a 32x64 output on a loaded 2-core CPU, nearly all of it per-call
    overhead. Here a hook only records ``(slot, tensor)``; the boundary stacks the small tensors
    of one (dtype, shape, shift, edge) group and reduces them together: one stack, shift, abs,
    compare, mean over the rows and ``index_copy_`` into the row per group (2-9 µs per tensor
    on the same machine). The values
    are those of the one-by-one reduction, bit for bit: the comparison runs in the tensor's own
    dtype, the 0/1 mean in float32. Tensors above ``_SMALL`` elements are reduced on the spot.

    A slot recorded twice before a flush (a module called twice) keeps the later tensor, as the
    one-by-one ``copy_`` did. At most ``cap`` tensors are held; :meth:`flush` runs at the
    collector's boundaries and :meth:`drop` forgets the pending entries.
    """

    def __init__(self, ledger: Ledger, cap: int = 64) -> None:
        self.ledger = ledger
        self.cap = cap
        self._pending: dict[int, tuple[torch.Tensor, float, float]] = {}
        self._index = SlotIndex()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, t: torch.Tensor, slot: int, shift: float, edge: float) -> None:
        """Record ``t`` (detached) for ``slot``; host bookkeeping only, unless ``t`` is large
        or the list is full."""
        d = t.detach()
        if d.numel() > _SMALL:
            self._pending.pop(slot, None)
            self.ledger.views[slot].copy_(fraction(d, shift, edge))
            return
        if len(self._pending) >= self.cap and slot not in self._pending:
            self.flush()
        self._pending[slot] = (d, shift, edge)

    def drop(self) -> None:
        self._pending = {}

    def flush(self) -> None:
        """Write every pending fraction into the ledger row (a few device ops per group)."""
        if not self._pending:
            return
        pending = self._pending
        self._pending = {}
        groups: dict[tuple[torch.dtype, torch.device, torch.Size, float, float],
                     tuple[list[int], list[torch.Tensor]]] = {}
        for slot, (d, shift, edge) in pending.items():
            slots, tensors = groups.setdefault((d.dtype, d.device, d.shape, shift, edge), ([], []))
            slots.append(slot)
            tensors.append(d)
        row = self.ledger.current
        with torch.no_grad():
            for (_, _, _, shift, edge), (slots, tensors) in groups.items():
                if len(tensors) == 1:
                    fractions = fraction(tensors[0], shift, edge).reshape(1)
                else:
                    x = torch.stack(tensors).view(len(tensors), -1)  # a copy: ours to modify in place
                    if shift:
                        x.sub_(shift)
                    x.abs_()
                    x.gt_(edge)
                    fractions = (x if x.dtype is torch.float32 else x.float()).mean(1)
                row.index_copy_(0, self._index(slots, row.device), fractions.to(row.dtype))


def fraction(d: torch.Tensor, shift: float, edge: float) -> torch.Tensor:
    """The fraction of ``d``'s values beyond ``edge`` from ``shift``, one tensor (0-d float32)."""
    x = d - shift if shift else d
    return (x.abs() > edge).float().mean()

