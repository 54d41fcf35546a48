"""The ladder, declared once: which ledger slots belong to which rung, in which order.

data -> forward -> loss -> gradients -> updates, with the weights as a step found them first
(a non-finite weight was made by the previous step's update). Two readers derive everything
from :data:`LADDER`, so they cannot drift apart:

- the host localisation (``detectors/nonfinite.locate``) walks a landed row rung by rung
  (:func:`first_bad`);
- the cross-rank agreement (``_distributed.RankSync``) turns the table into per-slot priority
  tensors on the device (:func:`slot_levels`), reduced with one ``amin`` per row.

What counts as non-finite is part of the table too: a ``norm`` rung's +inf without NaN may be
float32 overflow of finite values where norms are not confirmed exactly (accelerators in
deferred mode), and ``neginf_ok`` keys (attention masks) may hold -inf in their minimum.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Optional

import numpy as np

from .._findings import BOUNDARIES
from .._record import StepMeta, StepRecord
from .ledger import SlotRange

__all__ = ["LADDER", "Rung", "RungSpec", "first_bad", "groups", "nonfinite_counts", "slot_is_bad"]


@dataclasses.dataclass(frozen=True)
class RungSpec:
    """One rung of the ladder and the ledger slots it judges."""

    #: The ladder boundary a fault here is reported at.
    boundary: str
    #: Which rung (and how a fault is described): weights, data, forward, loss, outgrad,
    #: grad_norm, stale, update_norm.
    kind: str
    #: One block of scalar slots, or a (min, max) pair of blocks.
    blocks: tuple[str, ...]
    #: Slot order: "keys" (block order), "reversed", "forward" (modules in execution order),
    #: "backward" (the order backward reached them; reversed execution order where unknown).
    order: str = "keys"
    #: Only these keys of the block (None: all).
    keys: Optional[tuple[str, ...]] = None
    #: Judged by the GradScaler under AMP: a non-finite value there is a skipped step, not a fault.
    gradient: bool = False
    #: An L2 norm: +inf without NaN may be float32 overflow of finite values where not exact.
    norm: bool = False
    #: Keys whose minimum may legitimately be -inf (additive attention masks).
    neginf_ok: tuple[str, ...] = ()
    #: Steps to add to the row's step: -1 for weights, which the previous update made.
    step_offset: int = 0
    #: A StepMeta flag that must be set for the rung to be read ("weights_recorded").
    requires: Optional[str] = None


LADDER: tuple[RungSpec, ...] = (
    RungSpec("updates", "weights", ("param_norm",), norm=True, step_offset=-1, requires="weights_recorded"),
    RungSpec("data", "data", ("data.min", "data.max"), neginf_ok=("aux",)),
    RungSpec("forward", "forward", ("act.min", "act.max"), order="forward"),
    RungSpec("loss", "loss", ("loss",)),
    RungSpec("gradients", "outgrad", ("outgrad.min", "outgrad.max"), order="backward", gradient=True),
    RungSpec("gradients", "grad_norm", ("grad_norm",), order="reversed", gradient=True, norm=True),
    RungSpec("gradients", "stale", ("misc",), keys=("stale_grad_norm",), gradient=True),
    RungSpec("updates", "update_norm", ("update_norm",), norm=True),
)


@dataclasses.dataclass(frozen=True)
class Rung:
    """One priority level on the device: a rung, one of its keys, and where it is."""

    spec: RungSpec
    index: int
    key: str

    @property
    def boundary(self) -> str:
        return self.spec.boundary


def loss_keys(meta: Optional[StepMeta]) -> tuple[str, ...]:
    """The loss slots a row is judged on: the explicit loss when given, else the captured one."""
    return ("explicit" if meta is not None and meta.loss_explicit else "auto", "validation")


def groups(spec: RungSpec, blocks: Mapping[str, SlotRange], forward_order: Sequence[int],
           meta: Optional[StepMeta] = None, all_keys: bool = False) -> Iterator[tuple[int, str, list[int]]]:
    """``(key index, key, slots)`` of ``spec`` in ladder order. ``meta`` (host side) supplies
    the backward order and the loss key; without it (device side) the defaults are used."""
    first = blocks[spec.blocks[0]]
    keys = first.keys
    if spec.keys is not None:
        wanted = spec.keys
    elif spec.kind == "loss" and not all_keys:
        wanted = loss_keys(meta)
    else:
        wanted = None
    n = len(keys)
    if spec.order == "forward":
        order = [i for i in forward_order if i < n]
    elif spec.order == "backward":
        seen = list(dict.fromkeys(meta.bwd_order)) if meta is not None else []
        order = seen + [i for i in reversed(list(forward_order)) if i < n and i not in seen]
    elif spec.order == "reversed":
        order = list(reversed(range(n)))
    else:
        order = list(range(n))
    for i in order:
        if wanted is not None and keys[i] not in wanted:
            continue
        yield i, keys[i], [blocks[b].start + i for b in spec.blocks]


def slot_is_bad(value: float, spec: RungSpec, key: str, is_min: bool, exact_norms: bool) -> bool:
    """Whether one slot's value is a fault at this rung (see the module docstring)."""
    if math.isnan(value):
        return True
    if value == math.inf:
        return not (spec.norm and not exact_norms)
    if value == -math.inf:
        return not (is_min and key in spec.neginf_ok)
    return False


def applies(spec: RungSpec, meta: StepMeta) -> bool:
    if spec.requires is not None and not getattr(meta, spec.requires):
        return False
    return not (spec.gradient and meta.amp)


def first_bad(values: np.ndarray, blocks: Mapping[str, SlotRange], meta: StepMeta,
              forward_order: Sequence[int], exact_norms: bool) -> Optional[tuple[RungSpec, int, str]]:
    """The first rung, key index and key whose slots hold a fault in this row, or None."""
    for spec in LADDER:
        if not applies(spec, meta) or spec.blocks[0] not in blocks:
            continue
        for i, key, slots in groups(spec, blocks, forward_order, meta):
            pair = len(slots) == 2
            for j, s in enumerate(slots):
                if slot_is_bad(float(values[s]), spec, key, pair and j == 0, exact_norms):
                    return spec, i, key
    return None


def slot_levels(blocks: Mapping[str, SlotRange], forward_order: Sequence[int], width: int, *,
                amp: bool, loss_explicit: bool, exact_norms: bool
                ) -> tuple[list[Rung], list[float], list[bool], list[bool]]:
    """The device side of the same table: per slot of the row, its priority level (the number
    of levels for slots no rung reads), whether +inf is tolerated there (norm overflow) and
    whether -inf is (a mask's minimum). Levels follow :data:`LADDER` exactly."""
    meta = StepMeta(step=0, amp=amp, loss_explicit=loss_explicit, weights_recorded=True)
    rungs: list[Rung] = []
    assigned: list[tuple[list[int], int]] = []
    posinf_ok = [False] * width
    neginf_ok = [False] * width
    for spec in LADDER:
        if spec.blocks[0] not in blocks:
            continue
        for i, key, slots in groups(spec, blocks, forward_order, None, all_keys=True):
            level = len(rungs)
            rungs.append(Rung(spec, i, key))
            if not applies(spec, meta) or (spec.kind == "loss" and key not in loss_keys(meta)):
                continue
            assigned.append((slots, level))
            for j, s in enumerate(slots):
                if spec.norm and not exact_norms:
                    posinf_ok[s] = True
                if key in spec.neginf_ok and j == 0 and len(slots) == 2:
                    neginf_ok[s] = True
    levels = [float(len(rungs))] * width
    for slots, level in assigned:
        for s in slots:
            if s < width and levels[s] > level:
                levels[s] = float(level)
    return rungs, levels, posinf_ok, neginf_ok


def nonfinite_counts(record: StepRecord) -> dict[str, int]:
    """How many slots of each boundary's blocks are non-finite in a landed row (the
    ``nonfinite/<boundary>`` scalars). Whole blocks are counted, whatever a rung judges."""
    boundaries = [b for b in BOUNDARIES if any(spec.boundary == b for spec in LADDER)]
    counts: dict[str, int] = dict.fromkeys(boundaries, 0)
    if np.isfinite(record.values).all():
        return counts  # the usual row: one pass
    for spec in LADDER:
        if spec.keys is not None:
            continue  # a shared block (misc): only some of its keys are this rung's
        for name in spec.blocks:
            if name in record.blocks:
                counts[spec.boundary] += int((~np.isfinite(record.array(name))).sum())
    return counts
