"""Cross-rank agreement on non-finite faults, so every rank raises at the same step.

One rank raising while the others enter DDP's gradient all-reduce hangs the job until the
collective times out. So under ``torch.distributed`` a rank never raises on its own evidence.
Instead, at every row close (one per optimizer step, reached by every rank), each rank reduces
its row to one integer on the device,

    code = priority_of_first_bad_slot * world_size + rank      (no bad slot: LEVELS * world_size)

and one ``all_reduce(MIN)`` gives every rank the same answer: the earliest rung of the ladder that
went non-finite on any rank, and the lowest such rank. The all-reduce is enqueued like any
collective (on NCCL the host does not wait for it); the host reads the result through
:class:`~torch_sentinel._collect.transfer.AsyncFetch`. On CPU it is read at the same row close;
on accelerators one row later, when its copy has long landed, so the read never stalls the
stream. Every rank reads at the same program point, so every rank raises at the same call.

Priorities come from ``_collect/rungs.py``'s ``LADDER``, the table that
:func:`~torch_sentinel.detectors.nonfinite.locate` walks on the host: the same rungs in the same
order, with the same rules for what is non-finite (a norm's +inf on accelerators may be float32
overflow; a mask may hold -inf), so a single rank and the agreement cannot disagree.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ._collect.collector import Collector
from ._collect.ledger import Ledger
from ._collect.probe import Probe
from ._collect.rungs import Rung, slot_levels
from ._collect.transfer import AsyncFetch
from ._findings import Finding
from ._record import StepMeta
from ._record.fault import Fault

__all__ = ["Priorities", "RankSync", "gather_findings", "world"]


def world() -> tuple[Optional[int], int]:
    """(rank, world size) of the default process group; (None, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None, 1


class Priorities:
    """Per-slot priority tensors over the core row, derived from ``_collect.rungs.LADDER`` (the
    table the host localisation walks), rebuilt while the forward order is learned."""

    def __init__(self, ledger: Ledger, forward_order: Callable[[], list[int]], width: int,
                 exact_norms: bool) -> None:
        self.ledger = ledger
        self._forward_order = forward_order
        self.width = width
        self.exact_norms = exact_norms
        self._order: Optional[tuple[int, ...]] = None
        self.rungs: list[Rung] = []
        self._cache: dict[tuple[bool, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @property
    def none(self) -> int:
        return len(self.rungs)

    def tensors(self, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(levels, +inf tolerated, -inf tolerated) per slot, for this row's AMP / loss mode."""
        # The forward order settles during the first steps; after that the tensors are reused.
        if self._order is None or meta.step < 4:
            order = tuple(self._forward_order())
            if order != self._order:
                self._order, self._cache = order, {}
        key = (meta.amp, meta.loss_explicit)
        cached = self._cache.get(key)
        if cached is None:
            assert self._order is not None
            rungs, levels, posinf_ok, neginf_ok = slot_levels(
                self.ledger.blocks, self._order, self.width, amp=meta.amp,
                loss_explicit=meta.loss_explicit, exact_norms=self.exact_norms)
            self.rungs = rungs
            device = self.ledger.device
            cached = self._cache[key] = (
                torch.tensor(levels, dtype=torch.float32, device=device),
                torch.tensor(posinf_ok, dtype=torch.bool, device=device),
                torch.tensor(neginf_ok, dtype=torch.bool, device=device),
            )
        return cached

    def first_level(self, row: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        """On the device: the level of the row's first faulty slot (``none`` if there is none)."""
        levels, posinf_ok, neginf_ok = self.tensors(meta)
        row = row[: self.width]
        bad = torch.isnan(row) | ((row == math.inf) & ~posinf_ok) | ((row == -math.inf) & ~neginf_ok)
        return torch.where(bad, levels, torch.full_like(levels, float(self.none))).amin()


class RankSync(Probe):
    """Reduces each row's first non-finite slot across ranks and decides, on every rank alike,
    when to raise. ``decide(fault, rank)`` is called with the agreed fault; until then each
    rank's own faults are only held (:meth:`hold`)."""

    def __init__(
        self,
        collector: Collector,
        forward_order: Callable[[], list[int]],
        core_width: int,
        decide: Callable[[Fault, int], None],
        group: Optional[Any] = None,
    ) -> None:
        rank, size = world()
        self.rank = rank or 0
        self.world_size = size
        self.group = group
        self._c = collector
        self._prio = Priorities(collector.ledger, forward_order, core_width,
                                exact_norms=collector.ledger.host_view is not None)
        self._decide = decide
        # CPU reads are memory loads: decide at the same row close. Elsewhere, one row later.
        self.lag = 0 if collector.device.type == "cpu" else 1
        self._pending: collections.deque[tuple[int, AsyncFetch, int]] = collections.deque()
        self._held: Optional[Fault] = None
        self.done = False
        collector.add_probe(self)

    @classmethod
    def maybe(
        cls,
        enabled: bool,
        collector: Collector,
        forward_order: Callable[[], list[int]],
        core_width: int,
        decide: Callable[[Fault, int], None],
    ) -> Optional[RankSync]:
        """A RankSync when running under a process group of more than one rank, else None."""
        _, size = world()
        if not enabled or size < 2:
            return None
        return cls(collector, forward_order, core_width, decide)

    def hold(self, fault: Fault) -> None:
        """A local fault: kept (the first one only) as exact evidence for the agreed raise."""
        if self._held is None:
            self._held = fault

    # ------------------------------------------------------------------ device side
    def on_row_close(self, meta: StepMeta) -> None:
        if self.done:
            return
        with torch.no_grad():
            first = self._prio.first_level(self._c.ledger.current, meta)
            code = (first.to(torch.int64) * self.world_size + self.rank).reshape(1)
            dist.all_reduce(code, op=dist.ReduceOp.MIN, group=self.group)
            self._pending.append((meta.step, AsyncFetch([code]), self._prio.none))

    # ------------------------------------------------------------------ host side
    def on_row_closed(self, step: int) -> None:
        self.settle(upto=step - self.lag)

    def settle(self, upto: Optional[int] = None) -> None:
        """Read the reduced codes of rows up to ``upto`` (all when None) and act on the first
        fault. Blocks only on copies that were issued at least ``lag`` rows ago."""
        while self._pending and not self.done:
            step, fetch, none = self._pending[0]
            if upto is not None and step > upto:
                return
            self._pending.popleft()
            values = fetch.result(block=True)
            assert values is not None
            code = int(values[0][0])
            level, rank = divmod(code, self.world_size)
            if level >= none:
                continue
            self.done = True
            self._pending.clear()
            self._decide(self._fault(step, level, rank), rank)

    def _fault(self, step: int, level: int, rank: int) -> Fault:
        rung = self._prio.rungs[level]
        held = self._held
        if rank == self.rank and held is not None and held.step == max(step + rung.spec.step_offset, 0):
            return held  # this rank saw it happen: exact evidence
        param_owner = self._c.map.param_owner
        before = self._prio.rungs[level - 1] if level else None
        previous = before.index if before is not None and before.spec is rung.spec else None
        fault = Fault.at_rung(rung.spec.kind, step, rung.index, rung.key, self._c.module_names,
                              lambda p: param_owner.get(p, p.rpartition(".")[0]), previous=previous,
                              reported_by_rank=rank)
        fault.detail.setdefault("present", "non-finite values")
        if fault.module is not None:
            fault.detail["module_type"] = self._c.map.type_of(fault.module)
        return fault


def gather_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Every rank's findings, on every rank (a collective: call it on all ranks). Cold path."""
    _, size = world()
    if size < 2:
        return list(findings)
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, [f.to_dict() for f in findings])
    merged: list[Finding] = []
    seen: set[tuple[Any, ...]] = set()
    for rank_findings in gathered:
        for data in rank_findings or []:
            f = Finding.from_dict(data)
            key = (f.kind, f.module, f.boundary)
            if key not in seen:
                seen.add(key)
                merged.append(f)
    return merged
