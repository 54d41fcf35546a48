"""``saturation``: hidden sigmoid / tanh units stuck at their flat ends.

Thresholds:
- ``saturation.fraction`` = 0.5: more than half of a layer's outputs are saturated (pre-
  activation beyond +-5), DeepDiagnosis's saturation rule; such a layer passes almost no
  gradient (the derivative there is below 0.007).
- ``saturation.min_samples`` = 3 sampled steps (0-4, then every 10th), median fraction.
The output activation (the last module to run) is exempt: a confident sigmoid classifier
legitimately pushes its outputs to 0 and 1.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Optional

from .._collect.saturation import SaturatedFractions
from .._findings import Finding
from .._record import StepRecord
from ._robust import median
from .base import Detector, Threshold

__all__ = ["SaturationDetector"]


class SaturationDetector(Detector):
    kind = "saturation"
    rung = "forward"
    next_check = "inspect_initialization_and_input_scale"
    hypothesis = "pre-activations are too large (initialisation or input scale), so units sit on flat ends"
    reads = (SaturatedFractions,)
    thresholds = {
        "fraction": Threshold(0.5, "DeepDiagnosis: saturation when over half of sigmoid/tanh inputs are beyond +-5"),
        "min_samples": Threshold(3, "sampled steps (0-4, then every 10th), median fraction"),
    }

    def setup(self) -> None:
        self.fraction = self.threshold("fraction")
        self.min_samples = int(self.threshold("min_samples"))
        self._samples: dict[str, collections.deque[tuple[int, float]]] = {}
        self._reported: set[str] = set()
        self._fresh = False
        #: (forward order, its last leaf module), recomputed only when the order changes.
        self._leaf_order: Optional[tuple[tuple[int, ...], str]] = None

    def _output_module(self) -> str:
        """The last leaf module in forward order: the model's output activation, if any."""
        names = self.ctx.module_names
        order = tuple(self.ctx.forward_order())
        if self._leaf_order is None or self._leaf_order[0] != order:
            # Every proper prefix of a qualified name is a parent (one pass, not a pairwise
            # scan: that was quadratic in the module count, at every flush).
            parents = {n.rsplit(".", k)[0] for n in names for k in range(1, n.count(".") + 1)}
            leaves = [names[s] for s in order if names[s] and names[s] not in parents]
            self._leaf_order = (order, leaves[-1] if leaves else "")
        return self._leaf_order[1]

    def update(self, record: StepRecord) -> None:
        seen = record.fact(SaturatedFractions)
        if seen is None:
            return
        self._fresh = True
        for site, frac in zip(seen.modules, seen.values.tolist()):
            self._samples.setdefault(site, collections.deque(maxlen=self.min_samples)).append((record.step, frac))

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if not self._fresh:
            return []  # no sampled step since the last verdict: nothing changed (a median per site is not free)
        self._fresh = False
        found = []
        output = self._output_module()
        for site, samples in self._samples.items():
            if site in self._reported or site == output or len(samples) < self.min_samples:
                continue
            share = median([f for _, f in samples])
            if share <= self.fraction:
                continue
            self._reported.add(site)
            mtype = self.ctx.module_types.get(site, "")
            found.append(self.finding(
                f"{share:.0%} of the {mtype} outputs of {site} are saturated (pre-activation "
                f"beyond +-5) over {len(samples)} sampled steps: almost no gradient passes",
                module=site, step=samples[-1][0], onset_step=samples[0][0], severity="warning",
                evidence={"saturated_fraction": share, "steps": [s for s, _ in samples],
                          "fractions": [f for _, f in samples], "threshold": self.fraction},
            ))
        return found
