"""``probabilities_as_logits``: a loss that expects logits is fed probabilities.

``cross_entropy`` applies log-softmax itself and ``nll_loss`` expects log-probabilities, so a
model output that is already a distribution (non-negative rows summing to 1, e.g. a trailing
``nn.Softmax``) is squashed twice: gradients shrink and the loss plateaus (UMLAUT's "softmax
before the loss"). For ``binary_cross_entropy_with_logits`` the tell is a sigmoid's output, all
in [0, 1]. It is one named clause of the loss contracts (``losses/contracts.py``): the figures
are the input's range and its rows' largest |sum - 1| over the class dim, reduced on the device.
"""

from __future__ import annotations

from .._collect.loss_inputs import WATCHED, CompiledLoss
from .._findings import Finding
from .._record import StepRecord
from ..losses.verdicts import Limits, Verdict
from .base import Threshold
from .loss_contracts import ContractDetector, blind

__all__ = ["ProbabilitiesAsLogitsDetector"]

#: The kinds that read the loss functions' calls, and so go blind on a loss computed in compiled code.
LOSS_SIDE = ["probabilities_as_logits", "loss_broadcast", "invalid_loss_input", "invalid_target"]


class ProbabilitiesAsLogitsDetector(ContractDetector):
    kind = "probabilities_as_logits"
    explains = ("plateau", "vanishing_gradient")  # a second softmax squashes the gradient
    rung = "loss"
    next_check = "feed_logits_to_the_loss"
    hypothesis = "the loss applies softmax/sigmoid a second time"
    thresholds = {
        "tolerance": Threshold(1e-3, "float32 softmax rows sum to 1 within ~1e-6; logits essentially never do"),
        "min_probes": Threshold(3, "probed steps agreeing (steps 0-4, then every 10th): one odd batch never decides"),
    }

    def setup(self) -> None:
        super().setup()
        self._said_blind = False

    def limits(self) -> Limits:
        return Limits(tolerance=self.threshold("tolerance"), min_probes=int(self.threshold("min_probes")))

    def update(self, record: StepRecord) -> None:
        if not self._said_blind and record.fact(CompiledLoss) is not None:
            self._said_blind = True  # said once, for every loss-side kind
            self.flag(blind(self, record.step, WATCHED, LOSS_SIDE))
        super().update(record)

    def to_finding(self, v: Verdict) -> Finding:
        e = v.evidence
        evidence = {**e, "loss_function": v.loss, "probes_matching": e["probes_violating"], "call_site": v.site}
        return self.finding(v.message, module=v.module, step=v.step, onset_step=v.onset, severity=v.severity,
                            evidence=evidence)
