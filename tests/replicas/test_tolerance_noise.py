"""Tolerance mode over 10,000 steps of benign noise: no false alarm, and a real change is seen.

The fingerprint and vote path runs directly (no process group): at each step a tiny model's
tensors take a training-like update, and each of 4 simulated ranks holds its own copy with fresh,
independent relative noise of up to 1e-7 per element (what non-deterministic reductions leave:
about one float32 ulp). The vote sees exactly what an all-gather would give it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_sentinel._replicas.fingerprint import Marker
from torch_sentinel._replicas.vote import differing
from torch_sentinel.detectors.replica_divergence import ReplicaDivergenceDetector

RANKS = 4
STEPS = 10_000
NOISE = 1e-7
RTOL = ReplicaDivergenceDetector.thresholds["rtol"].default
SHAPES = [(64, 32), (32,), (10, 32), (10,)]


def _gathered(marker: Marker, copies: list[list[torch.Tensor]]) -> np.ndarray:
    cpu = torch.device("cpu")
    return np.stack([marker.rows(tensors, cpu).numpy() for tensors in copies])


@pytest.mark.slow
def test_no_false_alarm_in_10000_noisy_steps_and_a_real_change_is_found() -> None:
    g = torch.Generator().manual_seed(0)
    noise = [torch.Generator().manual_seed(1 + r) for r in range(RANKS)]
    base = [torch.randn(s, generator=g) * 0.1 for s in SHAPES]
    marker = Marker()
    alarms, exact_alarms, worst = 0, 0, 0.0
    for _ in range(STEPS):
        for t in base:
            t.add_(torch.randn(t.shape, generator=g), alpha=1e-3)  # the step's update
        copies = [[t * (1 + NOISE * (2 * torch.rand(t.shape, generator=noise[r]) - 1)) for t in base]
                  for r in range(RANKS)]
        rows = _gathered(marker, copies)
        alarms += differing(rows, "tolerance", RTOL).size
        exact_alarms += differing(rows, "exact", 0.0).size > 0
        dot = rows[:, :, 1].copy().view(np.float64)
        scale = np.sqrt(rows[:, :, 2].copy().view(np.float64)).min(axis=0)
        worst = max(worst, float(((dot.max(axis=0) - dot.min(axis=0)) / scale).max()))
    print(f"worst noise spread / norm over {STEPS} steps: {worst:.3g} (rtol {RTOL:g})")
    assert alarms == 0
    assert worst < RTOL / 10, worst  # the noise stays an order of magnitude below the allowance
    assert exact_alarms > STEPS * 0.9  # the noise is real: bit for bit, the copies differ
    # Not vacuous: a change of 1e-3 in one element of one rank is found and voted out.
    copies[2][0].view(-1)[17] += 1e-3
    rows = _gathered(marker, copies)
    assert list(differing(rows, "tolerance", RTOL)) == [0]
