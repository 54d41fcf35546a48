"""``probabilities_as_logits``: a loss that expects logits is fed probabilities.

``cross_entropy`` applies log-softmax itself and ``nll_loss`` expects log-probabilities, so a
model output that is already a distribution (non-negative rows summing to 1, e.g. a trailing
``nn.Softmax``) is squashed twice: gradients shrink and the loss plateaus (UMLAUT's "softmax
before the loss"). For ``binary_cross_entropy_with_logits`` the tell is every value in [0, 1].

Thresholds:
- ``probabilities_as_logits.tolerance`` = 1e-3: the largest |row sum - 1| accepted as a
  distribution; float32 softmax rows sum to 1 within ~1e-6, logits essentially never do.
- ``probabilities_as_logits.min_probes`` = 3 probed steps agreeing (steps 0-4, then every 10th),
  so one odd batch never decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from .._collect.loss_inputs import (
    BROADCAST_LOSSES,
    LOGIT_LOSSES,
    CompiledLoss,
    LossCall,
    LossInputRange,
)
from .._findings import Finding
from .._record import StepRecord
from .base import Detector, Threshold

__all__ = ["ProbabilitiesAsLogitsDetector"]


class ProbabilitiesAsLogitsDetector(Detector):
    kind = "probabilities_as_logits"
    rung = "loss"
    next_check = "feed_logits_to_the_loss"
    hypothesis = "the loss applies softmax/sigmoid a second time"
    reads = (LossCall, LossInputRange, CompiledLoss)
    thresholds = {
        "tolerance": Threshold(1e-3, "float32 softmax rows sum to 1 within ~1e-6; logits essentially never do"),
        "min_probes": Threshold(3, "probed steps agreeing (steps 0-4, then every 10th): one odd batch never decides"),
    }

    def setup(self) -> None:
        self.tolerance = self.threshold("tolerance")
        self.min_probes = int(self.threshold("min_probes"))
        self._hits: list[tuple[int, str, float, float, float]] = []
        self._probes = 0
        self._count = 0
        self._module: Optional[str] = None
        self._op: Optional[str] = None
        self._site: Optional[str] = None
        self._reported = False
        self._said_blind = False

    def update(self, record: StepRecord) -> None:
        if not self._said_blind and record.fact(CompiledLoss) is not None:
            self._said_blind = True
            self.flag(self._blind_under_compile(record.step))
        call, seen = record.fact(LossCall), record.fact(LossInputRange)
        if call is None or seen is None or record.meta.amp_skipped:
            return
        self._probes += 1
        fn = call.function
        if fn == "binary_cross_entropy_with_logits":
            is_prob = seen.min >= 0.0 and seen.max <= 1.0
        else:
            is_prob = seen.min >= 0.0 and seen.rowsum_deviation <= self.tolerance
        if is_prob:
            self._count += 1
            if len(self._hits) < 16:  # bounded: the evidence shows the first few
                self._hits.append((record.step, fn, seen.min, seen.max, seen.rowsum_deviation))
            self._module = call.input_module if call.input_module is not None else self._module
            self._op = call.input_op or self._op
            self._site = call.site or self._site

    def _blind_under_compile(self, step: int) -> Finding:
        """Under torch.compile a loss computed inside the compiled model is traced, not seen:
        say so once, at the first step, for both loss-side checks."""
        watched = ", ".join(f"F.{name}" for name in LOGIT_LOSSES + BROADCAST_LOSSES)
        return self.finding(
            f"probabilities_as_logits and loss_broadcast do not watch this run's loss: it is computed inside "
            f"compiled code (the loss reaching backward is a compiled graph's output, and no call of {watched} "
            "was made outside it), where those calls are traced, not seen. Everything else is watched. To check "
            "the loss inputs, "
            "compute the loss outside the compiled module, or run a few steps without torch.compile",
            step=step, severity="info",
            evidence={"not_watched": ["probabilities_as_logits", "loss_broadcast"], "reason": "torch.compile",
                      "loss_functions_watched": list(LOGIT_LOSSES + BROADCAST_LOSSES)},
            next_check="run_a_few_steps_eagerly",
        )

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if self._reported or self._count < self.min_probes or self._count < self._probes // 2:
            return ()
        self._reported = True
        step = self._hits[min(self.min_probes, len(self._hits)) - 1][0]
        _, fn, lo, hi, dev = self._hits[-1]
        if self._op and self._module is not None:
            source = (f"a {self._op.replace('Backward0', '').lower()} called in the forward of "
                      f"{self._module or '<model>'}" + (f", {self._site}" if self._site else ""))
        elif self._module is not None:
            source = f"the output of {self._module or '<model>'}"
        else:
            source = f"a tensor made by {self._op} outside the model" if self._op else "the model output"
        what = "values all in [0, 1]" if fn == "binary_cross_entropy_with_logits" else \
            f"non-negative rows summing to 1 (max |sum - 1| = {dev:.2g})"
        return [self.finding(
            f"{fn} expects logits but was given probabilities: {source} had {what} on "
            f"{self._count} of {self._probes} probed steps",
            module=self._module, step=step, onset_step=self._hits[0][0], severity="warning",
            evidence={"loss_function": fn, "min": lo, "max": hi, "max_rowsum_deviation": dev,
                      "probes_matching": self._count, "probes": self._probes,
                      "steps": [h[0] for h in self._hits][:8], "producer_op": self._op,
                      "call_site": self._site},
        )]
