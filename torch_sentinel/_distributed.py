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

Priorities follow :func:`~torch_sentinel.detectors.nonfinite.locate`: data, then module outputs
in forward order, loss, output gradients and gradient norms (skipped under a GradScaler, which
judges those itself), parameters, updates.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ._collect.collector import Collector, Fault
from ._collect.ledger import FLOAT_MAX
from ._collect.probe import Probe
from ._collect.records import StepMeta, TensorEvidence
from ._collect.transfer import AsyncFetch
from ._findings import Finding

__all__ = ["RankSync", "Rung", "gather_findings", "world"]


def world() -> tuple[Optional[int], int]:
    """(rank, world size) of the default process group; (None, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None, 1


@dataclasses.dataclass(frozen=True)
class Rung:
    """What a priority level means: a boundary, a module, and the detail locate() would give."""

    boundary: str
    module: Optional[str]
    detail: tuple[tuple[str, Any], ...] = ()
    #: -1 for weights found non-finite before a step: the previous step's update made them.
    step_offset: int = 0


class _Priorities:
    """Per-slot priority tensors over the core row, rebuilt while the forward order is learned."""

    def __init__(self, collector: Collector, forward_order: Callable[[], list[int]], width: int) -> None:
        self._c = collector
        self._forward_order = forward_order
        self.width = width
        self._key: Optional[tuple[int, ...]] = None
        self.rungs: list[Rung] = []
        self._plain: Optional[torch.Tensor] = None
        self._amp: Optional[torch.Tensor] = None

    @property
    def none(self) -> int:
        return len(self.rungs)

    def tensors(self, amp: bool, step: int) -> torch.Tensor:
        # The forward order settles during the first steps; after that the tensors are reused.
        if self._plain is None or step < 4:
            order = tuple(self._forward_order())
            if order != self._key:
                self._build(order)
        assert self._plain is not None and self._amp is not None
        return self._amp if amp else self._plain

    def _build(self, order: tuple[int, ...]) -> None:
        c = self._c
        L = c.ledger
        names = c.module_names
        slots: list[tuple[list[int], Rung, bool]] = []  # (row slots, rung, gradient rung)
        weights = L.block("param_norm")  # pre-step weight norms: the previous update, before all else
        for i, key in enumerate(weights.keys):
            slots.append(([weights.start + i], Rung("updates", self._owner(key), (("parameter", key),), -1), False))
        d_lo, d_hi = L.block("data.min").start, L.block("data.max").start
        slots.append(([d_lo, d_hi], Rung("data", None, (("input", "args[0]"),)), False))
        slots.append(([d_lo + 1, d_hi + 1], Rung("data", None, (("input", "extra input"),)), False))
        act_lo, act_hi = L.block("act.min").start, L.block("act.max").start
        og_lo, og_hi = L.block("outgrad.min").start, L.block("outgrad.max").start
        for m in order:
            slots.append(([act_lo + m, act_hi + m], Rung("forward", names[m]), False))
        loss = L.block("loss")
        for i, key in enumerate(loss.keys):
            slots.append(([loss.start + i], Rung("loss", None, (("loss", key),)), False))
        for m in reversed(order):  # backward meets modules roughly in reverse forward order
            slots.append(([og_lo + m, og_hi + m],
                          Rung("gradients", names[m], (("incoming_to", names[m]),)), True))
        grads = L.block("grad_norm")
        for i in reversed(range(len(grads))):
            slots.append(([grads.start + i], Rung("gradients", self._owner(grads.keys[i]),
                                                  (("parameter", grads.keys[i]),)), True))
        stale = L.blocks["misc"].index("stale_grad_norm")
        slots.append(([stale], Rung("gradients", None, (("present", "stale gradients"),)), True))
        update = L.block("update_norm")
        for i, key in enumerate(update.keys):
            slots.append(([update.start + i], Rung("updates", self._owner(key), (("parameter", key),)), False))
        self.rungs = [rung for _, rung, _ in slots]
        plain = [float(len(slots))] * self.width
        amp = list(plain)
        for level, (row_slots, _, gradient) in enumerate(slots):
            for s in row_slots:
                plain[s] = float(level)
                if not gradient:
                    amp[s] = float(level)
        device = L.device
        self._plain = torch.tensor(plain, dtype=torch.float32, device=device)
        self._amp = torch.tensor(amp, dtype=torch.float32, device=device)
        self._key = order

    def _owner(self, param: str) -> Optional[str]:
        return self._c.map.param_owner.get(param, param.rpartition(".")[0])


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
        self._prio = _Priorities(collector, forward_order, core_width)
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
            prio = self._prio.tensors(meta.amp, meta.step)
            row = self._c.ledger.current[: self._prio.width]
            # An additive attention mask legitimately holds -inf: only NaN counts in aux.min.
            aux = self._c.ledger.block("data.min").start + 1
            checked = row.clone()
            checked[aux : aux + 1].clamp_(min=-FLOAT_MAX)
            none = float(self._prio.none)
            first = torch.where(torch.isfinite(checked), torch.full_like(prio, none), prio).amin()
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
        step = max(step + rung.step_offset, 0)
        held = self._held
        if rank == self.rank and held is not None and held.step == step:
            return held  # this rank saw it happen: exact evidence
        detail = dict(rung.detail)
        detail.setdefault("present", "non-finite values")
        detail["reported_by_rank"] = rank
        if rung.module is not None:
            detail["module_type"] = self._c.map.type_of(rung.module)
        return Fault(step, rung.boundary, rung.module, TensorEvidence(), detail)


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
