"""The boundaries where recorded tensors are reduced into the step's row, or dropped.

A probe's hook never reduces a module output on the spot: it records it
(:meth:`Boundaries.reduce_later` for min/max, :meth:`Boundaries.fraction_later` for saturation
fractions), and everything pending is reduced together (``batch.py``) at the collector's
boundaries: the end of the model's forward, before and after backward, before the optimizer
step and the row's close. What is pending is dropped when a step is abandoned or the model's
forward raises, so a failed forward's evidence is never charged to the batch that runs next,
and its activations die with it.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch

from .._errors import SentinelError
from .batch import BatchedFractions, BatchedMax, OnBad
from .dtypes import DtypePolicy
from .ledger import Ledger

__all__ = ["Boundaries", "Pending"]


class Pending(Protocol):
    """A probe's own batch of recorded work, reduced at the collector's boundaries like the
    collector's (``ProbeHost.flush_at_boundaries``): ``flush`` writes it into the row and must
    raise nothing it means to report; ``drop`` forgets it, tensors and all."""

    def __len__(self) -> int: ...

    def flush(self) -> None: ...

    def drop(self) -> None: ...


class Boundaries:
    """The pending reductions of the step in progress.

    Args:
        ledger: the step's row of device slots.
        written: returns the step in progress's set of slot pairs already written (a pair's
            first write replaces its initial values; later ones fold into them).
        on_failure: called with an exception a batched reduction raised that is not a fault
            (a sentinel bug): the pending tensors are dropped and training goes on.
    """

    def __init__(self, ledger: Ledger, written: Callable[[], set[int]],
                 on_failure: Callable[[Exception], None]) -> None:
        self._ledger = ledger
        self._written = written
        self._on_failure = on_failure
        self.dtypes = DtypePolicy(ledger)
        #: Module outputs and output gradients waiting for the boundary's one batched reduction.
        self.batch = BatchedMax(ledger, self.dtypes)
        #: Sampled outputs waiting for their saturation fractions, at the same boundaries.
        self.fractions = BatchedFractions(ledger)
        #: Probes' own pending work (:meth:`hold`), flushed and dropped with the rest.
        self._held: list[Pending] = []

    def hold(self, pending: Pending) -> None:
        """Flush ``pending`` at every boundary and drop it with the rest, from now on."""
        self._held.append(pending)

    def reduce_into(self, t: torch.Tensor, lo: int, hi: int, compiling: bool = False, probe: str = "") -> None:
        """Fold ``t``'s min and max into the slot pair ``(lo, hi)``, on the device, now.

        The first write of a pair in a step is a single ``aminmax(out=...)``; later writes (a
        module called twice, gradient accumulation) fold with ``minimum``/``maximum``. Which is
        which is host bookkeeping, skipped while tracing under torch.compile. Which dtypes are
        reduced, and the row's own dtype, are ``dtypes.DtypePolicy``'s call.
        """
        d = t.detach()
        if not self.dtypes.admit(d, compiling, probe):
            return
        ledger = self._ledger
        views = ledger.views
        written = self._written()
        if not compiling and d.dtype is ledger.dtype and lo not in written:
            written.add(lo)
            torch.aminmax(d, out=(views[lo], views[hi]))
            return
        mn, mx = torch.aminmax(d)
        torch.minimum(views[lo], mn, out=views[lo])
        torch.maximum(views[hi], mx, out=views[hi])

    def reduce_later(self, t: torch.Tensor, lo: int, hi: int, probe: str, on_bad: Optional[OnBad] = None) -> None:
        """Record ``t`` for the slot pair ``(lo, hi)``: its largest ``|x|`` is written at the
        next boundary, batched with every other pending tensor (see ``batch.py``); in
        immediate mode ``on_bad(t)`` is called then if it is non-finite."""
        self.batch.add(t, lo, hi, probe, on_bad, self._written())

    def fraction_later(self, t: torch.Tensor, slot: int, shift: float, edge: float) -> None:
        """Record ``t`` for ``slot``: the fraction of its values beyond ``edge`` from ``shift``
        is written at the next boundary, batched per group of same-sized tensors (see
        ``batch.BatchedFractions``). Eager steps only."""
        self.fractions.add(t, slot, shift, edge)

    def flush(self) -> None:
        """Reduce the pending tensors now (a boundary). A failure that is not a SentinelError
        is a sentinel bug: one warning, the pending tensors are dropped, training goes on."""
        if not (len(self.batch) or len(self.fractions) or any(map(len, self._held))):
            return
        try:
            for pending in self._held:  # first, with the fractions: they check nothing, so raise no fault
                pending.flush()
            self.fractions.flush()
            self.batch.flush(self._written())
        except SentinelError:
            self.drop()
            raise
        except Exception as exc:
            self.drop()
            self._on_failure(exc)

    def drop(self) -> None:
        """Forget the pending tensors without reducing them (an abandoned row, a forward that
        raised, detach): the activations they are go with them."""
        self.batch.drop()
        self.fractions.drop()
        for pending in self._held:
            pending.drop()
