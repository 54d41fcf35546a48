"""The loss history as evidence (``detectors/_evidence.py``): the statistics every dynamics
verdict is held against, on synthetic series whose truth is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torch_sentinel._collect.ledger import Ledger
from torch_sentinel._record import StepMeta, StepRecord
from torch_sentinel.detectors._evidence import LossHistory, noise_band, standard_errors

_LEDGER = Ledger(torch.device("cpu"))
_LEDGER.add_block("loss", ["auto", "explicit", "validation"])


def history(losses: list[float]) -> LossHistory:
    h = LossHistory()
    for step, loss in enumerate(losses):
        values = np.zeros(_LEDGER.width, dtype=np.float32)
        values[0] = loss
        h.add(StepRecord(StepMeta(step=step, backward_calls=1), values, _LEDGER.blocks))
    return h


rng = np.random.default_rng(0)


@pytest.mark.parametrize("sigma", [0.01, 0.3], ids=["quiet", "noisy"])
def test_noise_band_is_the_per_step_noise_whatever_the_trend(sigma: float) -> None:
    steps = np.arange(400)
    trend = 3.0 - 0.005 * steps  # a steady fall: its differences are constant and drop out
    estimate = noise_band(trend + rng.normal(0, sigma, 400))
    assert 0.8 * sigma < estimate < 1.25 * sigma


def test_a_window_change_is_in_standard_errors_of_the_loss_itself() -> None:
    flat = history(list(2.0 + rng.normal(0, 0.05, 40)))
    change = flat.change()
    assert change is not None and abs(change.z) < 3 and change.steps_before == (0, 9)
    falling = history([2.0 - 0.02 * s + rng.normal(0, 0.05) for s in range(40)])
    fell = falling.change()
    assert fell is not None and fell.z < -8 and fell.after < fell.before
    assert standard_errors(0.0, 0.0, 5) == 0.0 and standard_errors(1.0, 0.0, 5) == math.inf


def test_a_rise_must_be_beyond_the_noise_band_or_a_doubling() -> None:
    noisy = history(list(5.0 + rng.normal(0, 2.0, 40)))  # wide noise, no rise
    assert noisy.rise() is None
    up = history([1.0 + rng.normal(0, 0.02) for _ in range(20)] + [1.5 + rng.normal(0, 0.02) for _ in range(20)])
    r = up.rise()
    assert r is not None and r.z > 4 and r.after > 1.4
    # a jump at the first update is a rise from the loss before any update (step 0)
    jump = history([1.4] + [8.0 + rng.normal(0, 3.0) for _ in range(12)])
    assert jump.rise(0) is not None


def test_too_high_is_contradicted_by_a_fast_falling_loss_and_supported_by_a_rise() -> None:
    fast = history([29.0 * 0.7**s for s in range(15)])
    assert fast.too_high(0).verdict == "contradicted"
    rising = history([1.0, 0.9, 0.8, 3.0, 5.0, 8.0, 9.0, 12.0, 15.0, 20.0, 25.0, 30.0])
    assert rising.too_high(0).verdict == "supported"
    short = history([1.0, 0.99, 0.98])
    assert short.too_high(0).verdict == "undecided"


def test_too_low_needs_slow_progress_and_a_converged_fit_contradicts_it() -> None:
    converged = history([29.0 * 0.3**s for s in range(20)] + [1e-9] * 30)
    assert converged.too_low(30).verdict == "contradicted"
    stalled = history([2.0 - 0.05 * s for s in range(10)] + list(1.5 + rng.normal(0, 0.01, 30)))
    assert stalled.too_low(10).verdict == "supported"
    # a loss that fell 100x and then stalled: converged at a constant lr, but the lr collapsing
    # a million-fold right where it stalled is the cause
    collapsed = history([3.0 * 0.6**s for s in range(12)] + list(0.01 + rng.normal(0, 0.0005, 30)))
    assert collapsed.too_low(12, lr_fell=1.0).verdict == "contradicted"
    assert collapsed.too_low(12, lr_fell=1e6).verdict == "supported"
    still_falling = history([2.0 - 0.03 * s + rng.normal(0, 0.005) for s in range(40)])
    assert still_falling.too_low(10).verdict == "contradicted"


def test_non_finite_losses_are_kept_apart() -> None:
    h = history([1.0, 1.1, math.nan, 0.9])
    assert len(h) == 3 and h.nonfinite_at == 2 and h.too_high(0).verdict == "supported"


def test_the_memo_is_not_saved_and_a_restored_history_answers_alike() -> None:
    """Regression: span()/noise() results are derived (``_memo_cache``), so a checkpoint of the
    history holds only the losses, and the restored history computes them afresh."""
    from torch_sentinel._plain import decode, encode

    h = history([1.0, 0.9, 0.85, 0.8, 0.78, 0.75])
    steps, losses = h.span(1, 4)
    band = h.noise()
    saved = encode(h, "history")
    assert not any(k.endswith("_cache") for k in saved["fields"])
    restored = decode(saved, "history")
    got_steps, got_losses = restored.span(1, 4)
    assert got_steps.tolist() == steps.tolist() and got_losses.tolist() == losses.tolist()
    assert restored.noise() == band
    h.add(StepRecord(StepMeta(step=6, backward_calls=1), np.array([0.7, 0, 0], dtype=np.float32), _LEDGER.blocks))
    assert h.span()[1][-1] == pytest.approx(0.7)  # a new loss clears the memo
