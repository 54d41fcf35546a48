"""The training loss: the sum of the losses ``backward()`` was called on, or the explicit one.

``loss.auto`` sums every captured backward of the step (``(loss / k).backward()`` over k
micro-batches records the mean). A backward is *pending* until the optimizer's step (or the
row's close) commits it; pending ones are dropped when the model's gradients are cleared before
its step (``discard``), so a loss whose gradients never reach this model's update is not its
loss (the scoping rule of ``scope.py``); ``loss.explicit`` is ``sentinel.observe_loss``; ``loss.validation``
is ``sentinel.observe_validation`` when given as a tensor.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .._record import StepMeta, StepRecord
from .._record.fault import Fault
from .probe import ProbeHost
from .tensors import tensor_evidence
from .transfer import read_now

__all__ = ["LossTally"]


class LossTally:
    """The step's training loss, kept by the collector (not a probe: the backward and optimizer
    events call it, in their order)."""

    def __init__(self, host: ProbeHost) -> None:
        self.host = host
        self.block = host.ledger.add_block("loss", ["auto", "explicit", "validation"])
        #: Losses of the backward calls not yet committed to a step (outside the row: they
        #: may outlive a row close), and how many.
        self.pending = torch.zeros((), dtype=torch.float32, device=host.device)
        self.pending_calls = 0
        self._pending_view = self.pending.numpy() if host.device.type == "cpu" else None
        self._scratch = torch.zeros((), dtype=torch.float32, device=host.device)
        self._scratch_view = self._scratch.numpy() if host.device.type == "cpu" else None

    def add(self, loss: torch.Tensor) -> None:
        """A backward on ``loss`` reached the model: pending until the step commits it."""
        host = self.host
        host.ledger.fit(loss.dtype)  # a float64 loss beyond float32's range stays finite
        self._fit()
        self.pending.add_(loss.detach().reshape(()))
        self.pending_calls += 1
        if host.immediate and not host.meta.loss_explicit and not self._pending_finite():
            host.on_fault(Fault.loss(host.step, tensor_evidence(loss)))

    def _fit(self) -> None:
        """The pending sum in the row's dtype (float64 once a float64 loss was seen)."""
        dtype = self.host.ledger.dtype
        if self.pending.dtype is not dtype:
            self.pending = self.pending.to(dtype)
            self._pending_view = self.pending.numpy() if self.pending.device.type == "cpu" else None

    def check_now(self, loss: torch.Tensor) -> None:
        """Immediate mode, before a backward on ``loss`` starts: is it finite?"""
        host = self.host
        if host.meta.loss_explicit:
            return
        if self._scratch.dtype is not loss.dtype and loss.dtype is torch.float64:
            self._scratch = self._scratch.double()  # a float64 loss beyond float32's range is finite
            self._scratch_view = self._scratch.numpy() if self._scratch.device.type == "cpu" else None
        self._scratch.copy_(loss.detach().reshape(()))
        view = self._scratch_view
        if not math.isfinite(float(view) if view is not None else read_now(self._scratch)):
            host.on_fault(Fault.loss(host.step, tensor_evidence(loss)))

    def _pending_finite(self) -> bool:
        view = self._pending_view
        return math.isfinite(float(view) if view is not None else read_now(self.pending))

    def discard(self) -> int:
        """Drop the pending losses (their gradients were cleared); how many there were."""
        n, self.pending_calls = self.pending_calls, 0
        self.pending.zero_()
        return n

    def commit(self) -> None:
        """The losses pending count toward this step (its optimizer steps, or its row closes
        without one: the AMP scaler skipped it)."""
        if self.pending_calls:
            self.host.ledger.views[self.block.start].add_(self.pending)
            self.pending.zero_()
            self.pending_calls = 0

    def observe_loss(self, loss: torch.Tensor) -> None:
        host = self.host
        i = self.block.start + 1
        host.ledger.fit(loss.dtype)
        host.ledger.views[i].add_(loss.detach().reshape(()))
        host.meta.loss_explicit = True
        if host.immediate and not host.finite(i):
            host.on_fault(Fault.loss(host.step, tensor_evidence(loss), "explicit"))

    def observe_validation(self, loss: Any) -> None:
        meta = self.host.meta
        if isinstance(loss, torch.Tensor):
            self.host.ledger.fit(loss.dtype)
            self.host.ledger.views[self.block.start + 2].copy_(loss.detach().reshape(()))
            meta.validation_on_device = True
        else:
            meta.validation = float(loss)
            meta.validation_on_device = False

    def take_pending_validation(self) -> Optional[StepRecord]:
        """A validation loss observed after the last optimizer step, as a record of its own.

        Its row has not closed (no step followed it), so it would never reach the host. Cold
        path (flush, detach): the record carries only the validation value, with this step's
        number; the row in progress keeps its other evidence.
        """
        ledger, meta = self.host.ledger, self.host.meta
        if meta.validation is None and not meta.validation_on_device:
            return None
        slot = self.block.start + 2
        values = ledger.initial_row()
        if meta.validation_on_device:
            values[slot] = read_now(ledger.views[slot])
        record = StepRecord(
            StepMeta(step=meta.step, validation=meta.validation, validation_on_device=meta.validation_on_device),
            values,
            ledger.blocks,
        )
        meta.validation, meta.validation_on_device = None, False
        return record
