"""Cross-rank agreement on non-finite faults, so that every rank raises at the same point.

One rank raising while the others enter a collective (DDP's gradient all-reduce, FSDP's
all-gathers) hangs the job until the collective times out. So under ``torch.distributed`` a rank
never raises on its own evidence: the ranks agree first, with one small collective at a point
that every rank reaches the same number of times, whatever its loop does with
``optimizer.step()``.

**Where** (:class:`~torch_sentinel._lockstep.Lockstep`). At each training forward of the model as
passed to ``attach()``: DDP and FSDP make every rank run the same training forwards. Not at the
end of ``optimizer.step()``: a rank that skips one step would miss that collective, and its next
one would pair with the others' (gloo aborts the job on the size mismatch, NCCL hangs).

**What.** Each rank reduces, on the device, what it recorded since the previous point to one
integer per row and keeps the earliest (:class:`Codes`):

    code = (when * levels + level) * world_size + rank        (no fault: a larger constant)

``level`` is the first rung of the ladder that went non-finite; ``when`` is 0 for the rows this
rank closed since the previous point and 1 for its row still open (micro-batches of gradient
accumulation, or the step whose ``optimizer.step()`` it skipped). A second integer is minus the
rows this rank closed since attach. One ``all_reduce(MIN)`` of these 16 bytes gives every rank
the same answer: the earliest fault (closed rows first, then the earliest rung, then the lowest
rank: a NaN in rank 1's batch beats the NaN gradients DDP then spreads to rank 0), and the most
rows any rank has closed (the replica check counts optimizer steps with it).

**When read.** The all-reduce is enqueued like any collective (on NCCL the host does not wait for
it); the host reads the result through :class:`~torch_sentinel._collect.transfer.AsyncFetch`: on
CPU at the same point, on accelerators at the next one, when its copy has long landed, so the
read never stalls the stream. Every rank reads at the same point, so every rank acts there.

**Acting.** The rank that saw the fault sends its own description (one ``broadcast_object_list``,
once, cold path): every rank raises for the same step (the faulty rank's numbering: a rank that
skipped a step counts one less), naming the same rank, boundary and module.

Priorities come from ``_collect/rungs.py``'s ``LADDER``, the table that
:func:`~torch_sentinel.detectors.nonfinite.locate` walks on the host: the same rungs in the same
order, with the same rules for what is non-finite (a norm's +inf on accelerators may be float32
overflow; a mask may hold -inf), so a single rank and the agreement cannot disagree.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
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
from ._lockstep import Follower, Lockstep
from ._record import StepMeta
from ._record.fault import Fault

__all__ = ["Codes", "Priorities", "RankSync", "gather_findings", "world"]

logger = logging.getLogger("torch_sentinel")


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
        self._cache: dict[tuple[bool, bool], tuple[list[float], torch.Tensor, torch.Tensor]] = {}

    @property
    def none(self) -> int:
        return len(self.rungs)

    def tensors(self, meta: StepMeta) -> tuple[list[float], torch.Tensor, torch.Tensor]:
        """(levels, +inf refused, -inf refused) per slot, for this row's AMP / loss mode."""
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
                levels,
                torch.tensor([not ok for ok in posinf_ok], dtype=torch.bool, device=device),
                torch.tensor([not ok for ok in neginf_ok], dtype=torch.bool, device=device),
            )
        return cached


#: The value part of "nothing to report": above ``2 * levels`` for any model.
_NOTHING = 1 << 40


class Codes:
    """A row reduced to its agreement code on the device (see the module docstring), with the
    scaled level tensors cached per row mode and per ``when``."""

    def __init__(self, priorities: Priorities, rank: int, world_size: int) -> None:
        self.prio = priorities
        self.rank = rank
        self.world_size = world_size
        #: Per (AMP, explicit loss, when): the level list it was made from, and its codes.
        self._scaled: dict[tuple[bool, bool, int], tuple[list[float], torch.Tensor]] = {}

    @property
    def levels(self) -> int:
        return self.prio.none

    def none(self) -> int:
        """This rank's code when it has nothing to report (above any fault's, whatever the
        number of levels: a rank that has not built its levels yet reports the same)."""
        return _NOTHING * self.world_size + self.rank

    def decode(self, code: int, levels: int) -> Optional[tuple[bool, int, int]]:
        """(in a closed row, level, rank) of a reduced code, or None: no fault anywhere."""
        value, rank = divmod(code, self.world_size)
        if value >= 2 * levels:
            return None
        return value < levels, value % levels, rank

    def of_row(self, row: torch.Tensor, meta: StepMeta, when: int) -> torch.Tensor:
        """On the device: the int64 code of ``row``'s first faulty slot, as a 0-d tensor."""
        levels, posinf_bad, neginf_bad = self.prio.tensors(meta)
        key = (meta.amp, meta.loss_explicit, when)
        cached = self._scaled.get(key)
        if cached is None or cached[0] is not levels:  # new levels while the forward order settles
            w, n = self.world_size, len(self.prio.rungs)
            codes = [(int(v) + when * n) * w + self.rank if v < n else self.none() for v in levels]
            cached = self._scaled[key] = (levels, torch.tensor(codes, dtype=torch.int64, device=row.device))
        scaled = cached[1]
        row = row[: self.prio.width]
        bad = torch.isnan(row) | ((row == math.inf) & posinf_bad) | ((row == -math.inf) & neginf_bad)
        return torch.where(bad, scaled, self.none()).amin()

    @staticmethod
    def earliest(first: torch.Tensor, then: torch.Tensor, closed_bound: int) -> torch.Tensor:
        """On the device: ``first`` if it is a fault of a closed row (below ``closed_bound``),
        else ``then`` (rows in the order they closed: the earliest faulty one wins)."""
        return torch.where(first < closed_bound, first, then)


@dataclasses.dataclass
class _Point:
    """One agreement point's collective, waiting to be read."""

    index: int
    fetch: AsyncFetch
    levels: int
    #: This rank's closed rows since the previous point: (step, device code).
    closed: list[tuple[int, torch.Tensor]]
    #: The step of this rank's open row at the point.
    open_step: int


class RankSync(Probe, Follower):
    """Agrees on non-finite faults across ranks at every lockstep point: ``decide(fault, rank)``
    is called on every rank alike with the agreed fault (until then each rank only holds its
    own, :meth:`hold`). ``rows_agreed`` is the most rows any rank has closed, as of the last
    agreement read (-1 before the first)."""

    name = "cross-rank agreement"

    def __init__(self, lockstep: Lockstep, collector: Collector, forward_order: Callable[[], list[int]],
                 core_width: int, decide: Callable[[Fault, int], None], group: Optional[Any] = None) -> None:
        rank, size = world()
        self.rank = rank or 0
        self.world_size = size
        self.group = group
        self._c = collector
        prio = Priorities(collector.ledger, forward_order, core_width,
                          exact_norms=collector.ledger.host_view is not None)
        self._codes = Codes(prio, self.rank, size)
        self._decide = decide
        # CPU reads are memory loads: act at the same point. Elsewhere, one point later.
        self.lag = 0 if collector.device.type == "cpu" else 1
        self._pending: collections.deque[_Point] = collections.deque()
        self._closed: list[tuple[int, torch.Tensor]] = []
        self._held: Optional[Fault] = None
        self._points = 0
        self.rows = 0
        self.rows_agreed = -1
        self.done = False
        self._warned = False
        lockstep.follow(self)
        collector.add_probe(self)

    @classmethod
    def maybe(cls, enabled: bool, lockstep: Optional[Lockstep], collector: Collector,
              forward_order: Callable[[], list[int]], core_width: int,
              decide: Callable[[Fault, int], None]) -> Optional[RankSync]:
        """A RankSync following ``lockstep`` (None outside a process group of more than one
        rank: then None)."""
        if not enabled or lockstep is None:
            return None
        return cls(lockstep, collector, forward_order, core_width, decide)

    def hold(self, fault: Fault) -> None:
        """A local fault: kept (the first one only) as exact evidence for the agreed raise."""
        if self._held is None:
            self._held = fault

    # ------------------------------------------------------------------ device side
    def on_row_close(self, meta: StepMeta) -> None:
        self.rows += 1
        if self.done:
            return
        try:
            with torch.no_grad():
                code = self._codes.of_row(self._c.ledger.current, meta, when=0)
                if self._closed:  # several rows between two points: the earliest faulty one
                    code = Codes.earliest(self._closed[-1][1], code, self._codes.levels * self.world_size)
        except Exception as exc:  # never the reason training stops; the point still runs
            self._warn(f"row {meta.step} could not be reduced ({type(exc).__name__}: {exc})")
            return
        self._closed.append((meta.step, code))

    def at_point(self) -> None:
        """One agreement (a collective: every rank calls it at the same point)."""
        point = self._issue()
        self._pending.append(point)
        self._read(upto=point.index - self.lag)

    def at_report(self) -> None:
        """The last agreement, from ``report()``: what was recorded since the last point, then
        every pending result (cold path: waits for the device)."""
        self._pending.append(self._issue())
        self._read(upto=None)

    def _issue(self) -> _Point:
        closed, self._closed = self._closed, []
        meta = self._c.meta
        self._codes.prio.tensors(meta)  # the number of levels, the same on every rank, is known
        out = torch.empty(2, dtype=torch.int64, device=self._c.device)
        code: Optional[torch.Tensor] = closed[-1][1] if closed else None
        try:
            with torch.no_grad():
                if not self.done and (meta.forward_calls or meta.backward_calls):
                    # The open row holds micro-batches already (or a skipped step's work).
                    now = self._codes.of_row(self._c.ledger.current, meta, when=1)
                    code = now if code is None else torch.minimum(code, now)
                if code is None or self.done:
                    out[0].fill_(self._codes.none())
                else:
                    out[0].copy_(code)
                out[1].fill_(-self.rows)
        except Exception as exc:  # join the collective anyway, with nothing to report
            self._warn(f"the open row could not be reduced ({type(exc).__name__}: {exc})")
            out = torch.tensor([self._codes.none(), -self.rows], dtype=torch.int64, device=self._c.device)
        dist.all_reduce(out, op=dist.ReduceOp.MIN, group=self.group)
        point = _Point(self._points, AsyncFetch([out]), self._codes.levels, closed, meta.step)
        self._points += 1
        return point

    # ------------------------------------------------------------------ host side
    def _read(self, upto: Optional[int]) -> None:
        """Read the results of points up to ``upto`` (all when None) and act on the first fault.
        Blocks only on copies issued at least ``lag`` points ago."""
        while self._pending:
            point = self._pending[0]
            if upto is not None and point.index > upto:
                return
            self._pending.popleft()
            values = point.fetch.result(block=True)
            assert values is not None
            code, minus_rows = (int(v) for v in values[0])
            self.rows_agreed = max(self.rows_agreed, -minus_rows)
            found = None if self.done else self._codes.decode(code, point.levels)
            if found is None:
                continue
            self.done = True
            closed, level, rank = found
            fault = self._agreed_fault(point, closed, level, rank)
            self._decide(fault, rank)

    def _agreed_fault(self, point: _Point, closed: bool, level: int, rank: int) -> Fault:
        """The faulty rank's description of the fault, on every rank (a collective, once)."""
        mine: Optional[Fault] = None
        if rank == self.rank:
            try:
                self._c.drain(block=True)  # the faulty row's record: the exact evidence (held)
                mine = self._fault(self._step_of(point, closed), level, rank)
            except Exception as exc:  # the others still get a description: their own
                self._warn(f"the fault could not be described ({type(exc).__name__}: {exc})")
        box: list[Any] = [mine]
        dist.broadcast_object_list(box, src=rank, group=self.group)
        if isinstance(box[0], Fault):
            return box[0]
        return self._fault(point.closed[0][0] if closed and point.closed else point.open_step, level, rank)

    def _step_of(self, point: _Point, closed: bool) -> int:
        """This rank's step of the row that held the fault (cold path: reads the device)."""
        if not closed:
            return point.open_step
        bound = point.levels * self.world_size  # codes below it are faults of closed rows
        for step, code in point.closed:  # each code is the earliest fault up to its row
            if int(code) < bound:
                return step
        return point.closed[-1][0]

    def _fault(self, step: int, level: int, rank: int) -> Fault:
        rungs = self._codes.prio.rungs
        rung = rungs[level]
        held = self._held
        if rank == self.rank and held is not None and held.step == max(step + rung.spec.step_offset, 0):
            return held  # this rank saw it happen: exact evidence
        param_owner = self._c.map.param_owner
        before = rungs[level - 1] if level else None
        previous = before.index if before is not None and before.spec is rung.spec else None
        fault = Fault.at_rung(rung.spec.kind, step, rung.index, rung.key, self._c.module_names,
                              lambda p: param_owner.get(p, p.rpartition(".")[0]), previous=previous,
                              reported_by_rank=rank)
        fault.detail.setdefault("present", "non-finite values")
        if fault.module is not None:
            fault.detail["module_type"] = self._c.map.type_of(fault.module)
        return fault

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("torch_sentinel: cross-rank agreement on rank %d: %s", self.rank, why)

    def close(self) -> None:
        """Detach (not a collective): a fault this rank saw after the last agreement is logged."""
        held = self._held
        if held is not None and not self.done:
            logger.warning(
                "torch_sentinel: rank %d saw non-finite values at step %d (%s, %s) after the last "
                "cross-rank agreement; not raised, since the ranks could not agree on it: call "
                "sentinel.report() on every rank before detach() to have it raised everywhere",
                self.rank, held.step, held.boundary, held.module)
        self._pending.clear()
        self._closed = []


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
