"""The training loss: the sum of the losses ``backward()`` was called on, or the explicit one.

``loss.auto`` sums every captured backward of the step (``(loss / k).backward()`` over k
micro-batches records the mean); ``loss.explicit`` is ``sentinel.observe_loss``; ``loss.validation``
is ``sentinel.observe_validation`` when given as a tensor.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..faults import Fault
from ..probe import Probe, ProbeHost
from ..records import StepMeta, StepRecord
from ..tensors import tensor_evidence
from ..transfer import read_now

__all__ = ["LossProbe"]


class LossProbe(Probe):
    name = "loss"

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.block = host.ledger.add_block("loss", ["auto", "explicit", "validation"])

    def on_backward(self, loss: torch.Tensor) -> None:
        host = self.host
        i = self.block.start
        host.ledger.fit(loss.dtype)  # a float64 loss beyond float32's range stays finite
        host.ledger.views[i].add_(loss.detach().reshape(()))
        if host.immediate and not host.meta.loss_explicit and not host.finite(i):
            host.on_fault(Fault(host.step, "loss", None, tensor_evidence(loss), {}))

    def observe_loss(self, loss: torch.Tensor) -> None:
        host = self.host
        i = self.block.start + 1
        host.ledger.fit(loss.dtype)
        host.ledger.views[i].add_(loss.detach().reshape(()))
        host.meta.loss_explicit = True
        if host.immediate and not host.finite(i):
            host.on_fault(Fault(host.step, "loss", None, tensor_evidence(loss), {"explicit": True}))

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
