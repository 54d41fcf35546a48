"""``loss_broadcast``: an element-wise loss whose input and target shapes differ and broadcast.

``mse_loss(pred_of_shape_(B, 1), target_of_shape_(B,))`` silently compares every prediction with
every target, a (B, B) matrix: the model learns the target mean. PyTorch only warns once (for
MSE, L1, Huber and smooth L1; ``kl_div``, Poisson and Gaussian NLL, hinge embedding and
multi-label soft margin do not even warn), and the warning is easy to lose in a log. It is one
named clause of the loss contracts (``losses/contracts.py``): the shapes are host facts, so it
costs no device work and is reported at the first probed training call. A target that
broadcasts into the input's own shape (a scalar, or one vector for the whole batch) is meant.
"""

from __future__ import annotations

from typing import ClassVar

from .._findings import Finding
from ..losses.verdicts import Limits, Verdict
from .base import Threshold
from .loss_contracts import ContractDetector

__all__ = ["LossBroadcastDetector"]


class LossBroadcastDetector(ContractDetector):
    kind = "loss_broadcast"
    explains = ("plateau",)  # every prediction is pulled toward the batch's mean target
    rung = "shapes"
    next_check = "reshape_target_or_output_to_match"
    hypothesis = "the loss silently broadcasts mismatched shapes"
    thresholds: ClassVar[dict[str, Threshold]] = {}

    def limits(self) -> Limits:
        return Limits()  # a host fact: reported at its first breach, no threshold

    def to_finding(self, v: Verdict) -> Finding:
        return self.finding(v.message, step=v.step, severity="error", evidence={**v.evidence, "loss_function": v.loss})
