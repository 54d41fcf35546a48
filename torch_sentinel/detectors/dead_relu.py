"""``dead_relu``: ReLU units that never fire over a window of training steps.

Thresholds:
- ``dead_relu.fraction`` = 0.7: a layer is reported when at least 70% of its units produced no
  positive output in any sampled batch of the window. 70% is the dying-ReLU bar of AUTOTRAINER
  (70% zero gradients) and the dead-node bar of DeepDiagnosis (70% of outputs <= 0); ours is
  stricter per unit (never positive over a whole window, not 70% of outputs), so a sparse but
  alive layer stays quiet.
- ``dead_relu.min_steps`` = 20 sampled steps: a unit that fires on 1 batch in 20 is alive; fewer
  steps would call rare features dead. Detectors run every 10 steps, so a layer dead from its
  onset is reported 20 steps later.
- ``dead_relu.every`` = 4: every step is sampled up to step 100, then one step in 4. The window
  counts sampled batches, so a unit must stay silent on ``min_steps`` batches either way: past
  step 100 a dead layer is reported up to 4x later, never more readily. The per-unit reduction
  reads every ReLU output in full (on the benchmark MLP, ~0.5 ms of a 26 ms step), which is
  why it is not taken every step of a long run; set 1 to sample every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np

from .._collect.probe import Probe
from .._collect.relu import ReluSite, ReluWatch
from .._collect.transfer import AsyncFetch
from .._findings import Finding
from .._record import StepRecord
from .base import Detector, Threshold

__all__ = ["DeadReluDetector"]


class DeadReluDetector(Detector):
    """Owns the probe that keeps, on the device, a per-unit "fired in some batch" mask per
    ReLU site, and fetches it once a window of sampled steps is complete."""

    kind = "dead_relu"
    rung = "forward"
    next_check = "inspect_initialization_and_learning_rate"
    hypothesis = "units stopped firing (too high a learning rate, or a bad bias/initialisation)"
    thresholds = {
        "fraction": Threshold(0.7, "AUTOTRAINER's dying-ReLU bar (70% zero gradients) and DeepDiagnosis's "
                                   "dead-node bar (70% of outputs <= 0); per unit over a whole window here"),
        "min_steps": Threshold(20, "sampled steps: a unit that fires on 1 batch in 20 is alive"),
        "every": Threshold(4, "past step 100, one step in 4 is sampled (the mask reads every ReLU output)"),
    }
    #: A device copy in flight.
    live_attributes = frozenset({"_pending"})

    def __init__(self) -> None:
        self.watch = ReluWatch()

    def setup(self) -> None:
        self.fraction = self.threshold("fraction")
        self.min_steps = int(self.threshold("min_steps"))
        self.watch.every = max(1, int(self.threshold("every")))
        self._pending: Optional[tuple[list[ReluSite], list[int], AsyncFetch, int]] = None
        self._last_step = 0
        self._first_step: Optional[int] = None
        self._latest: dict[str, float] = {}
        self._said_blind = False

    def probes(self) -> Sequence[Probe]:
        return (self.watch,)

    def update(self, record: StepRecord) -> None:
        if self._first_step is None:
            self._first_step = record.step
        self._last_step = record.step

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        found = self._blind_under_compile()
        found += self._consume(block=final)
        if self._pending is None:
            snap = self.watch.snapshot(self.min_steps)
            if snap is not None:
                self._pending = (*snap, self._last_step)
                found += self._consume(block=final)  # on CPU the copy has already landed
        return found

    def _blind_under_compile(self) -> list[Finding]:
        """Under torch.compile ``nn.ReLU`` modules are watched (reduced in the graph, folded
        outside it); functional ReLU calls inside compiled code are not: say which, once."""
        if self._said_blind or self._first_step is None or not self.watch.traced():
            return []
        self._said_blind = True
        lines = self.watch.unwatched_under_compile()
        if not lines:
            return []
        watched = [n or "<model>" for n, t in self.ctx.module_types.items() if t == "ReLU"]
        return [self.finding(
            f"dead_relu does not watch the ReLUs called as functions inside compiled code "
            f"({', '.join(lines[:4])}{', ...' if len(lines) > 4 else ''}): under torch.compile the "
            "call cannot be attributed to a module. nn.ReLU modules are watched"
            f"{' (' + ', '.join(watched[:8]) + ')' if watched else ' (the model has none)'}; "
            "to check the functional ones, use nn.ReLU modules or run a few steps without torch.compile",
            step=self._first_step, severity="info",
            evidence={"not_watched": "dead_relu", "reason": "torch.compile",
                      "functional_relu_calls": lines[:8], "relu_modules": watched[:8]},
            next_check="run_a_few_steps_eagerly",
        )]

    def statistics(self) -> dict[str, float]:
        return dict(self._latest)

    def _consume(self, block: bool) -> list[Finding]:
        if self._pending is None:
            return []
        sites, steps, fetch, at_step = self._pending
        result = fetch.result(block=block)
        if result is None:
            return []
        self._pending = None
        dead = result[0]
        found = []
        for i, site in enumerate(sites):
            frac = float(dead[i])
            label = site.module or "<model>"
            self._latest[f"{label}.dead_fraction"] = frac
            if frac < self.fraction:
                continue
            alive = result[1 + i]
            units = int(alive.size)
            dead_units = np.flatnonzero(~alive.astype(bool))
            axis = "channels" if site.unit_dim == 1 else "features"
            mtype = self.ctx.module_types.get(site.module, "")
            functional = bool(site.where) and mtype != "ReLU"
            at = f" (a functional ReLU called in {mtype or 'the model'}.forward at {site.where})" if functional else ""
            found.append(self.finding(
                f"{len(dead_units)} of {units} ReLU {axis} ({frac:.0%}) applied in "
                f"{label}{at} never produced a positive output over {steps[i]} sampled training steps",
                module=site.module, step=at_step, onset_step=max(0, at_step - steps[i] + 1),
                severity="warning",
                evidence={
                    "dead_fraction": frac, "dead_units": len(dead_units), "units": units,
                    "unit_axis": axis, "steps_observed": steps[i],
                    "first_dead_units": dead_units[:8].tolist(), "threshold": self.fraction,
                    "call_site": site.where if functional else None,
                },
            ))
        return found
