"""The published loss-spike detectors, replayed on a loss trace: each says only *that* a step spiked.

Each rule is read from its project's source (see ``/work/shared/prior-art.md``):

- **Megatron-LM** (``RerunStateMachine.is_unexpectedly_large``, threshold 10 as its
  ``check_for_spiky_loss`` passes it): the largest |loss| of the first 100 values is the
  reference; afterwards a loss >= 10x that reference is flagged.
- **OLMo-core** (``SkipStepOptimizer.get_step_factor``, ``sigma_factor`` 6, rolling interval
  128): once 64 losses are held, a loss more than 6 standard deviations (torch's unbiased
  ``std_mean``) above the mean of the previous ones (up to 128) is flagged. Every loss enters
  the window, flagged or not. (Its grad-norm condition is left out: these are loss traces.)
- **Lightning** ``SpikeDetection`` (mode "min", window 10, warmup 1, rtol 2, atol None): from
  batch 1, a loss that is not lower than the previous one and differs from the running mean of
  the last 10 unflagged losses by at least 2x that mean is flagged (Lightning raises there; the
  replay goes on without adding the flagged loss, as a resumed run that skips the batch).
- **ZClip** (alpha 0.97, z 2.5, 25 warm-up steps, "zscore" mode, adaptive scaling), applied to
  the loss instead of the gradient norm: the first 25 values initialise an EMA mean and
  variance; afterwards z = (x - mean) / (std + 1e-6) > 2.5 is flagged, and the EMA is updated
  with the clipped value ``mean + 2.5 * std / (z / 2.5)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["BASELINES", "lightning", "megatron", "olmo_core", "zclip"]


def megatron(loss: Sequence[float], threshold: float = 10.0, samples: int = 100) -> list[int]:
    flagged, reference, seen = [], 0.0, 0
    for step, value in enumerate(loss):
        v = abs(float(value))
        if not math.isfinite(v):
            continue
        if seen < samples:
            seen += 1
            reference = max(reference, v)
            continue
        if v >= reference * threshold:
            flagged.append(step)
    return flagged


def olmo_core(loss: Sequence[float], sigma: float = 6.0, interval: int = 128) -> list[int]:
    flagged: list[int] = []
    held: list[float] = []
    for step, value in enumerate(loss):
        held.append(float(value))
        while len(held) > interval + 1:
            held.pop(0)
        if len(held) < max(2, interval // 2):
            continue
        previous = np.array(held[:-1])
        if held[-1] - previous.mean() > sigma * previous.std(ddof=1):
            flagged.append(step)
    return flagged


def lightning(loss: Sequence[float], window: int = 10, warmup: int = 1, rtol: float = 2.0) -> list[int]:
    flagged: list[int] = []
    recent: list[float] = []
    last = 0.0
    for step, value in enumerate(loss):
        v = float(value)
        if not math.isfinite(v):
            flagged.append(step)  # finite_only=True: a non-finite loss is a spike
            continue
        running = float(np.mean(recent)) if recent else math.nan
        spike = False
        if step >= warmup and not v - last <= 0.0 and recent:
            spike = abs(v - running) >= abs(rtol * running)
        if spike:
            flagged.append(step)
            continue
        recent.append(v)
        recent = recent[-window:]
        last = v
    return flagged


def zclip(loss: Sequence[float], alpha: float = 0.97, z_thresh: float = 2.5, warmup: int = 25) -> list[int]:
    flagged: list[int] = []
    buffer: list[float] = []
    mean = var = 0.0
    ready = False
    for step, value in enumerate(loss):
        v = float(value)
        if not ready:
            buffer.append(v)
            if len(buffer) >= warmup:
                mean = sum(buffer) / len(buffer)
                var = sum((x - mean) ** 2 for x in buffer) / len(buffer)
                ready = True
            continue
        std = var**0.5
        z = (v - mean) / (std + 1e-6)
        effective = v
        if z > z_thresh:
            flagged.append(step)
            effective = mean + (z_thresh * std) / (z / z_thresh)
        mean = alpha * mean + (1 - alpha) * effective
        var = alpha * var + (1 - alpha) * (effective - mean) ** 2
    return flagged


BASELINES = {"Megatron": megatron, "OLMo-core": olmo_core, "Lightning": lightning, "ZClip": zclip}
