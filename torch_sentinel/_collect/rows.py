"""Closed rows on their way to the host: the ring they are copied into, and their hand-over.

A closed row is copied into the :class:`~torch_sentinel._collect.transfer.HostRing` without
waiting (``push``); rows whose copy has completed are handed on as
:class:`~torch_sentinel._record.StepRecord` (``drain``). The row can grow after the ring
was sized (a detector's block added at attach, a module first called late, float64 slots): the
older, narrower rows are handed over first, then the ring is widened.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .._record import FactSources, StepMeta, StepRecord
from .ledger import Ledger
from .transfer import HostRing

__all__ = ["RowQueue"]


class RowQueue:
    """The ledger's closed rows, queued for the host.

    Args:
        ledger: the step's row of device slots.
        device: where the row lives.
        on_record: called on the training thread with each row that reached the host.
        rows: how many rows the ring holds before ``push`` waits for the oldest copy.
    """

    def __init__(self, ledger: Ledger, device: torch.device, on_record: Callable[[StepRecord], None],
                 rows: int, sources: Optional[FactSources] = None) -> None:
        self._ledger = ledger
        self._sources = sources
        self._device = device
        self.on_record = on_record
        self.ring = HostRing(device, ledger.current.numel(), rows=rows, dtype=ledger.dtype)

    def landed(self) -> bool:
        """Whether some queued row may be ready to hand on (host bookkeeping, no device read)."""
        return self.ring.head > self.ring.tail

    def push(self, meta: StepMeta) -> None:
        """Queue the ledger's row with ``meta`` and reset the ledger for the next step."""
        if self._outgrown():
            self.drain(block=True)
        self.ring.push(self._ledger.current, meta)
        self._ledger.reset()

    def take(self, meta: StepMeta) -> StepRecord:
        """The ledger's row now, as a record (a blocking copy: cold path), then reset the ledger."""
        values = self._ledger.current.detach().to("cpu", copy=True).numpy()  # float32 or float64
        record = StepRecord(meta, values, self._ledger.blocks, self._sources)
        self._ledger.reset()
        return record

    def drain(self, block: bool = False) -> None:
        """Hand on each row whose copy completed (``block``: wait for all of them)."""
        outgrown = self._outgrown()
        if outgrown:
            block = True  # the row grew; older rows are narrower but still valid
        for meta, values in self.ring.drain(block=block):
            self.on_record(StepRecord(meta, values, self._ledger.blocks, self._sources))
        if outgrown and self.ring.pending() == 0:
            ledger = self._ledger
            self.ring = HostRing(self._device, ledger.current.numel(), rows=self.ring.rows, dtype=ledger.dtype)

    def _outgrown(self) -> bool:
        ledger = self._ledger
        return ledger.current.numel() > self.ring.width or ledger.dtype is not self.ring.dtype
