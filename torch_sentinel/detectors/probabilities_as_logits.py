"""``probabilities_as_logits``: a loss that expects logits is fed probabilities.

``cross_entropy`` applies log-softmax itself and ``nll_loss`` expects log-probabilities, so a
model output that is already a distribution (non-negative rows summing to 1, e.g. a trailing
``nn.Softmax``) is squashed twice: gradients shrink and the loss plateaus (UMLAUT's "softmax
before the loss"). For ``binary_cross_entropy_with_logits`` the tell is every value in [0, 1].
It is one named clause of the loss contracts (``losses/contracts.py``); the figures are the
input's minimum and its rows' largest |sum - 1| over the class dim, reduced on the device.

Thresholds:
- ``probabilities_as_logits.tolerance`` = 1e-3: the largest |row sum - 1| accepted as a
  distribution; float32 softmax rows sum to 1 within ~1e-6, logits essentially never do.
- ``probabilities_as_logits.min_probes`` = 3 probed steps agreeing (steps 0-4, then every 10th),
  so one odd batch never decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._collect.loss_inputs import WATCHED
from .._collect.records import StepRecord
from .._findings import Finding
from ..losses.verdicts import Limits, Verdict
from ._common import threshold
from .loss_contracts import ContractDetector

__all__ = ["ProbabilitiesAsLogitsDetector"]

#: The kinds that read the loss functions' calls, and so go blind on a loss computed in compiled code.
LOSS_SIDE = ["probabilities_as_logits", "loss_broadcast", "invalid_loss_input", "invalid_target"]


class ProbabilitiesAsLogitsDetector(ContractDetector):
    kind = "probabilities_as_logits"
    boundary = "loss"

    _said_blind = False

    def limits(self) -> Limits:
        return Limits(tolerance=threshold(self, "tolerance"), min_probes=int(threshold(self, "min_probes")))

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        return self._blind_under_compile(records) + list(super().observe(records))

    def _blind_under_compile(self, records: Sequence[StepRecord]) -> list[Finding]:
        """Under torch.compile a loss computed inside the compiled model is traced, not seen:
        say so once, at the first step, for every loss-side check."""
        inputs = self._inputs
        if self._said_blind or not records or inputs is None or not inputs.blind_under_compile():
            return []
        self._said_blind = True
        watched = ", ".join(f"F.{name}" for name in WATCHED)
        return [self.finding(
            f"{', '.join(LOSS_SIDE)} do not watch this run's loss: it is computed inside compiled code (the loss "
            f"reaching backward is a compiled graph's output, and no call of {watched} was made outside it), "
            "where those calls are traced, not seen. Everything else is watched. To check the loss inputs, "
            "compute the loss outside the compiled module, or run a few steps without torch.compile",
            step=records[0].step, severity="info",
            evidence={"not_watched": LOSS_SIDE, "reason": "torch.compile", "loss_functions_watched": list(WATCHED)},
            next_check="run_a_few_steps_eagerly",
        )]

    def to_finding(self, v: Verdict) -> Finding:
        e = v.evidence
        evidence = {**e, "loss_function": v.loss, "probes_matching": e["probes_violating"], "call_site": v.site}
        return self.finding(v.message, module=v.module, step=v.step, onset_step=v.onset, severity=v.severity,
                            evidence=evidence, next_check="feed_logits_to_the_loss")
