"""``loss_broadcast``: an element-wise loss whose input and target shapes differ and broadcast.

``mse_loss(pred_of_shape_(B, 1), target_of_shape_(B,))`` silently compares every prediction with
every target, a (B, B) matrix: the model learns the target mean. PyTorch only warns once, and
the warning is easy to lose in a log. The shapes are host facts, so this costs no device work
and fires on the first training call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from .._collect.loss_inputs import LossBroadcasts
from .._findings import Finding
from .._record import StepRecord
from .base import Detector

__all__ = ["LossBroadcastDetector"]


class LossBroadcastDetector(Detector):
    kind = "loss_broadcast"
    rung = "shapes"
    next_check = "reshape_target_or_output_to_match"
    hypothesis = "the loss silently broadcasts mismatched shapes"
    reads = (LossBroadcasts,)

    def update(self, record: StepRecord) -> None:
        self._report(record.fact(LossBroadcasts))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if final:  # a loop that never stepped: the calls of the step in progress
            seen = self.ctx.in_progress().facts.get(LossBroadcasts)
            self._report(seen if isinstance(seen, LossBroadcasts) else None)
        return ()

    def _report(self, seen: Optional[LossBroadcasts]) -> None:
        for ev in seen.events if seen is not None else ():
            self.flag(self.finding(
                f"{ev.function} got input of shape {ev.input_shape} and target of shape "
                f"{ev.target_shape}; they broadcast to {ev.broadcast_shape}, so every "
                "prediction is compared with targets of other samples",
                step=ev.step, severity="error",
                evidence={"loss_function": ev.function, "input_shape": list(ev.input_shape),
                          "target_shape": list(ev.target_shape),
                          "broadcast_shape": list(ev.broadcast_shape)},
            ))
