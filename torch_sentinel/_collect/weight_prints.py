"""First-order fingerprints of the weights, for ``no_update``'s "did this weight move?".

A bit-identical L2 norm is second-order evidence only: a weight just before a normalisation
layer is scale-invariant, its gradient is orthogonal to it, and an SGD step changes its norm by
``(lr |g| / |W|)^2 / 2``, below float32's resolution although every element moved. The
fingerprints move at first order: the L1 norm of the weight accumulated in float64
(``sum sign(w) dw``) and its largest magnitude (for a gradient whose signed sum rounds to 0, as
a BatchNorm weight's before another normalisation can). They are taken before the optimizer
step, for every weight on the first rows and then only for the weights the detector asks about
(those whose L2 norm stood still), and their relative change since the previous row is written
into the row on the device: the :class:`WeightChange` fact.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable, Optional

import torch

from .._record import Fact, StepRecord
from .compat import is_compiling
from .probe import Probe, ProbeHost
from .tensors import reduces

__all__ = ["WeightChange", "WeightPrints"]

_BLOCK = "weight_change"
#: Rows from the attach on which every watched weight is fingerprinted (then: candidates only).
FINGERPRINT_ALL = 10


@dataclasses.dataclass(frozen=True)
class WeightChange(Fact):
    """The relative change of each fingerprinted weight's first-order fingerprint since the
    previous row (0: bit-identical fingerprints)."""

    #: Weights whose change is valid in this row (fingerprinted in this row and the previous).
    names: tuple[str, ...]
    #: Per watched parameter (``record.keys``), the change; read only for ``names``.
    values: dict[str, float]


class WeightPrints(Probe):
    """Owned by the ``no_update`` detector, which says which weights to fingerprint."""

    name = "weight_prints"
    publishes = (WeightChange,)
    #: Set up at attach (the fingerprints hold device tensors of the live weights).
    live_attributes = frozenset({"host", "_candidates", "_prints", "unprintable"})

    def __init__(self, candidates: Callable[[], set[str]]) -> None:
        self._candidates = candidates
        self._prints: Optional[_Fingerprints] = None
        #: Parameters that cannot be fingerprinted (float8, sharded): the L2 norm decides alone.
        self.unprintable: set[str] = set()

    def setup(self, host: ProbeHost) -> None:
        printable = [(n, p) for n, p in host.params
                     if p.is_floating_point() and not host.sharded and reduces(p.dtype, p.device)]
        self.unprintable = {n for n, _ in host.params} - {n for n, _ in printable}
        if printable:
            self._prints = _Fingerprints(host, printable, self._candidates)
            host.provide(WeightChange, _weight_change)

    def on_pre_step(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        if self._prints is None:
            return
        try:
            self._prints.take()
        except Exception as exc:  # a device or dtype without a float64 L1 norm
            # Only the fingerprints stop: the still L2 norm decides alone, as before them.
            self.unprintable.update(self._prints.names)
            self._prints = None
            warnings.warn(
                f"torch_sentinel: no_update's first-order weight fingerprints are not taken "
                f"({type(exc).__name__}: {exc}); a still weight norm is reported without them, so a "
                "scale-invariant weight before a normalisation layer may be reported as not updating",
                RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        self._prints = None


def _weight_change(record: StepRecord) -> Optional[WeightChange]:
    fact = record.meta.facts.get(_Printed)
    if not isinstance(fact, _Printed) or not record.has(_BLOCK):
        return None
    return WeightChange(fact.names, dict(zip(record.keys(_BLOCK), record.array(_BLOCK).tolist())))


@dataclasses.dataclass(frozen=True)
class _Printed(Fact):
    """Which weights this row's fingerprint change is valid for (host bookkeeping)."""

    names: tuple[str, ...]


class _Fingerprints:
    """The fingerprints taken before a step, and their relative change since the previous row
    written into the row: device ops only; which names hold a valid change is host bookkeeping
    (the ``_Printed`` fact)."""

    def __init__(self, host: ProbeHost, params: list[tuple[str, torch.Tensor]],
                 candidates: Callable[[], set[str]]) -> None:
        self.host = host
        self.names = [n for n, _ in params]
        self.tensors = {n: p for n, p in params}
        self.candidates = candidates
        self.block = host.ledger.add_block(_BLOCK, [n for n, _ in host.params], -1.0)
        self.slot = {n: i for i, (n, _) in enumerate(host.params)}
        self.position = {n: i for i, n in enumerate(self.names)}
        self.dtype = torch.float32 if host.device.type == "mps" else torch.float64
        self.previous: Optional[torch.Tensor] = None
        self.taken: dict[str, int] = {}
        self._index: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def take(self) -> None:
        """Fingerprint before the step of the row in progress."""
        host = self.host
        meta = host.meta
        if is_compiling() or not meta.weights_recorded or _Printed in meta.facts:
            return  # once per row, on the rows whose weight norms were read
        row = meta.row
        wanted = self.candidates()
        if row >= FINGERPRINT_ALL and not wanted:
            return  # the usual case once training runs: nothing to confirm, nothing to pay
        names = tuple(self.names if row < FINGERPRINT_ALL else [n for n in self.names if n in wanted])
        host.publish(_Printed(()))
        if not names:
            return
        with torch.no_grad():
            weights = [self.tensors[n].detach() for n in names]
            # Two prints per weight: its L1 norm and its largest magnitude (the L1 norm alone is
            # blind when sum(sign(w) dw) rounds to 0: a BatchNorm weight of ones followed by
            # another normalisation gets a gradient summing to ~0, and 8% of its SGD steps
            # left both the L2 and the L1 norm bit-identical while every element moved).
            fp = torch.stack([t.to(host.device) for t in (
                *torch._foreach_norm(weights, 1, dtype=self.dtype),
                *torch._foreach_norm(weights, math.inf, dtype=self.dtype))]).view(2, -1)
            at, slots = self._indices(names)
            if self.previous is None:
                self.previous = torch.zeros((2, len(self.names)), dtype=self.dtype, device=host.device)
            before = self.previous.index_select(1, at)
            change = ((fp - before).abs() / before.abs().clamp_min(torch.finfo(self.dtype).tiny)).amax(0)
            dest = host.ledger.current[self.block.start : self.block.stop]
            dest.index_copy_(0, slots, change.to(dest.dtype))
            self.previous.index_copy_(1, at, fp)
        host.publish(_Printed(tuple(n for n in names if self.taken.get(n) == row - 1)))
        for n in names:
            self.taken[n] = row

    def _indices(self, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._index.get(names)
        if cached is None:
            device = self.host.device
            cached = (torch.tensor([self.position[n] for n in names], device=device),
                      torch.tensor([self.slot[n] for n in names], device=device))
            self._index = {names: cached}
        return cached
