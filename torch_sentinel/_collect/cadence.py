"""When the sampled evidence is taken: one schedule for every probe that samples.

Some evidence is too costly for every step: every module's output (hooks on all modules, see
``watching.py``), every output gradient, tanh/sigmoid saturation, the loss inputs' probability
check, every weight's norm. It is taken on *sampled* steps: all of the first ``first`` steps
(where most faults start, and where the detectors want several samples quickly), every
``every``-th step up to step ``WIDEN_AT``, then every ``WIDE``-th: a long run's steady state
pays for one sampled step in fifty. A sampled detector that needs three samples so confirms a
fault starting after step 100 within 150 steps; the per-step checks (non-finite values at the
model's outputs, loss, gradient and weight norms, updates) do not sample.
"""

from __future__ import annotations

__all__ = ["WIDE", "WIDEN_AT", "sampled"]

#: From this step on, sampled steps are ``WIDE`` apart.
WIDEN_AT = 100
WIDE = 50


def sampled(step: int, first: int = 10, every: int = 10) -> bool:
    """Whether ``step`` is a sampled step of the schedule ``(first, every)``."""
    if step < first:
        return True
    return step % (every if step < WIDEN_AT else max(every, WIDE)) == 0
