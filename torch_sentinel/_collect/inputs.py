"""Statistics of the model's main input, reduced on the device on sampled steps.

Mean and std go into ledger slots (one ``std_mean``); for tabular inputs ``(batch, features)``
a per-feature "varied within some batch" mask is OR-ed over the window, so a feature that is
constant in every batch (std 0: a broken join, a filled column) shows up. No host read.

Under ``torch.compile`` the hook is traced and runs every step inside the graph: the mean, the
std and the per-feature "varied" vector are reduced there (fused), and the vector is folded into
the window's mask outside the graph, at run time, by ``graph_taps`` (the mask's size is only
known from the batch; sampling is decided at run time, so nothing recompiles).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

import torch

from .._record import Fact, StepMeta, StepRecord
from .cadence import sampled
from .graph_taps import MaskTap
from .probe import Probe, ProbeHost
from .transfer import AsyncFetch

__all__ = ["InputMoments", "InputStats"]

#: Feature masks are only kept for tabular inputs this wide or narrower (bounded memory).
_MAX_FEATURES = 1 << 16


@dataclasses.dataclass(frozen=True)
class InputMoments(Fact):
    """On a sampled step: the mean and standard deviation of the model's main input."""

    mean: float
    std: float


class InputStats(Probe):
    name = "input_stats"
    publishes = (InputMoments,)
    #: Set up at attach; the constant-feature mask and its step count are the window.
    live_attributes: ClassVar[frozenset[str]] = frozenset({"first", "every", "tap", "_slots"})

    def __init__(self, first: int = 5, every: int = 10) -> None:
        self.first = first
        self.every = every
        self.varied: Optional[torch.Tensor] = None
        self.mask_steps = 0
        #: Counts the masks made (a new one when the feature count changes): a verdict on one
        #: mask is final for that mask only.
        self.mask_generation = 0
        self._slots = (0, 0)
        self._masked_step = -1
        self.tap: Optional[MaskTap] = None

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        block = host.ledger.add_block("input_stats", ["mean", "std"])
        self._slots = (block.start, block.start + 1)
        self.tap = MaskTap(self._from_graph, host.device)
        host.provide(InputMoments, _moments)

    def close(self) -> None:
        if self.tap is not None:
            self.tap.close()

    def on_data(self, t: torch.Tensor, main: bool, name: Optional[str], compiling: bool) -> None:
        c = self.host
        if not main or not (compiling or sampled(c.step, self.first, self.every)):
            return
        views = c.ledger.views
        t = t.detach()
        with torch.no_grad():
            x = t if t.dtype in (torch.float32, torch.float64) else t.float()
            std, mean = torch.std_mean(x) if x.numel() > 1 else (torch.zeros((), device=x.device), x.reshape(()))
            views[self._slots[0]].copy_(mean)
            views[self._slots[1]].copy_(std)
            tabular = x.ndim == 2 and 2 <= x.shape[1] <= _MAX_FEATURES and x.shape[0] > 1
            if compiling:
                # Traced into the graph and run every step (no host step counter in compiled
                # code); on_row_close marks the rows, and the mask is folded at run time.
                if tabular and self.tap is not None:
                    lo, hi = torch.aminmax(x, dim=0)
                    self.tap.emit(0, hi > lo)
                return
            c.mark_in_row(InputMoments)
            if tabular:
                lo, hi = torch.aminmax(x, dim=0)
                self._fold(hi > lo)

    def _fold(self, varied: torch.Tensor) -> None:
        if self.varied is None or self.varied.shape[0] != varied.shape[0]:
            self.varied = torch.zeros(varied.shape[0], dtype=torch.bool, device=varied.device)
            self.mask_steps = 0
            self.mask_generation += 1
        torch.logical_or(self.varied, varied, out=self.varied)
        if self._masked_step != self.host.step:
            self._masked_step = self.host.step
            self.mask_steps += 1

    def _from_graph(self, key: int, varied: torch.Tensor) -> None:
        """Run time, from compiled code: the eager schedule (sampled steps only), then fold."""
        step = self.host.step
        if step < self.first or step % self.every == 0:
            self._fold(varied)

    def on_row_close(self, meta: StepMeta) -> None:
        if self.host.traced:
            meta.in_row.add(InputMoments)

    def snapshot(self, min_steps: int) -> Optional[tuple[int, AsyncFetch]]:
        """A non-blocking copy of the constant-feature mask once ``min_steps`` sampled steps
        have been seen; the mask then keeps accumulating (a feature that varies once is fine)."""
        if self.varied is None or self.mask_steps < min_steps:
            return None
        return self.mask_steps, AsyncFetch([self.varied.clone()])


def _moments(record: StepRecord) -> Optional[InputMoments]:
    if InputMoments not in record.meta.in_row or not record.has("input_stats"):
        return None
    return InputMoments(record.value("input_stats", "mean"), record.value("input_stats", "std"))
