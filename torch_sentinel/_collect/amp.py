"""AMP: the unscaled loss behind ``GradScaler.scale(loss)``, the scale, and skipped steps.

``GradScaler.scale`` and ``GradScaler.step`` are patched (no public hook exists): the scaled
loss is mapped back to the user's loss before the loss tally sees it, the scale goes into
``misc.amp_scale``, and a ``scaler.step(optimizer)`` that never reached the optimizer (the
scaler found inf/NaN and skipped) is reported to the collector, which closes the row.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import torch

from .._record import Fact, StepRecord
from .probe import ProbeHost

__all__ = ["AmpTracker", "LossScale"]


@dataclasses.dataclass(frozen=True)
class LossScale(Fact):
    """The ``GradScaler`` scale the step's loss was multiplied by (AMP steps only; whether the
    scaler skipped the step is ``meta.amp_skipped``)."""

    scale: float


class AmpTracker:
    """The GradScaler's part in a step, kept by the collector (the patches of ``scale`` and
    ``step`` call it): the loss behind a scaled one, the scale, and steps the scaler skipped."""

    def __init__(self, host: ProbeHost) -> None:
        self._pending: Optional[tuple[weakref.ref[torch.Tensor], torch.Tensor, Any]] = None
        self._depth = 0
        self._stepped = False
        self.host = host
        self._scale_slot = host.ledger.block("misc").index("amp_scale")
        host.provide(LossScale, _loss_scale)

    def on_scale(self, scaler: Any, outputs: Any, result: Any) -> None:
        """``scaler.scale(outputs)`` returned ``result``: remember which loss it scaled."""
        if not isinstance(outputs, torch.Tensor) or not isinstance(result, torch.Tensor):
            return
        if getattr(scaler, "is_enabled", lambda: True)():
            self._pending = (weakref.ref(result), outputs, scaler)

    def unscaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The user's loss behind ``loss`` if it is the scaler's output; ``loss`` otherwise."""
        pending = self._pending
        if pending is None or pending[0]() is not loss:
            return loss
        self.host.meta.amp = True
        scale = getattr(pending[2], "_scale", None)
        if isinstance(scale, torch.Tensor):
            self.host.ledger.views[self._scale_slot].copy_(scale.detach().reshape(()))
        self._pending = None
        return pending[1]

    def before_scaler_step(self) -> None:
        self._depth += 1
        self._stepped = False

    def after_scaler_step(self, scaler: Any, raised: bool = False) -> bool:
        """Whether the scaler skipped the optimizer's step (it found inf/NaN gradients)."""
        self._depth -= 1
        if raised:
            return False  # the step raised: the user's exception says what happened
        enabled = getattr(scaler, "is_enabled", lambda: True)()
        if enabled and not self._stepped:
            self.host.meta.amp = True
            self.host.meta.amp_skipped = True
            return True
        return False

    def optimizer_stepped(self) -> None:
        """An optimizer's step ran (inside ``scaler.step``, unless the scaler skipped it)."""
        if self._depth:
            self._stepped = True

    def row_closed(self) -> None:
        self._pending = None

    def close(self) -> None:
        self._pending = None


def _loss_scale(record: StepRecord) -> Optional[LossScale]:
    if not record.meta.amp or not record.has("misc"):
        return None
    return LossScale(record.value("misc", "amp_scale"))
