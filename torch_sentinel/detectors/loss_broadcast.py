"""``loss_broadcast``: an element-wise loss whose input and target shapes differ and broadcast.

``mse_loss(pred_of_shape_(B, 1), target_of_shape_(B,))`` silently compares every prediction with
every target, a (B, B) matrix: the model learns the target mean. PyTorch only warns once, and
the warning is easy to lose in a log. The shapes are host facts, so this costs no device work
and fires on the first training call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

from .._collect.loss_inputs import LossInputs
from .._collect.probe import Probe
from .._collect.records import StepRecord
from .._findings import Finding
from .base import Detector

__all__ = ["LossBroadcastDetector"]


class LossBroadcastDetector(Detector):
    kind = "loss_broadcast"
    boundary = "shapes"

    _inputs: Optional[LossInputs] = None
    _seen = 0

    def probes(self) -> Sequence[Probe]:
        self._inputs = LossInputs.shared(self.ctx.extras)
        return (self._inputs,)

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        if self._inputs is None:
            return ()
        events = self._inputs.broadcasts[self._seen :]
        self._seen = len(self._inputs.broadcasts)
        found = []
        for ev in events:
            found.append(self.finding(
                f"{ev.function} got input of shape {ev.input_shape} and target of shape "
                f"{ev.target_shape}; they broadcast to {ev.broadcast_shape}, so every "
                "prediction is compared with targets of other samples",
                step=ev.step, severity="error",
                evidence={"loss_function": ev.function, "input_shape": list(ev.input_shape),
                          "target_shape": list(ev.target_shape),
                          "broadcast_shape": list(ev.broadcast_shape)},
                next_check="reshape_target_or_output_to_match",
            ))
        return found

    def finish(self) -> Iterable[Finding]:
        return self.observe(())
