"""The forensics rules on hand-made windows: each cause from the figures that define it.

Pure host functions (numpy in, verdict out), so each rule is pinned down by the smallest window
that shows it; the same rules on real runs are in ``test_loss_spike.py``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from torch_sentinel.detectors._spike_forensics import SpikeWindow, attribute, per_unit
from torch_sentinel.detectors._spike_watch import RobustLossWatch

UNITS = ["emb", "blocks.0.attn", "blocks.0.mlp", "blocks.1.mlp", "head"]
T = 24
SPIKE = 20


def window(rng: np.random.Generator, lr_key: Optional[list[Optional[str]]] = None) -> SpikeWindow:
    """A healthy window: every series wobbles by a few percent around its level."""
    u = len(UNITS)

    def wobble(level: float, spread: float = 0.05) -> np.ndarray:
        return level * np.exp(rng.normal(0, spread, (T, u)))

    weight = 10.0 * np.cumprod(np.exp(rng.normal(0, 1e-4, (T, u))), axis=0)
    stats = {
        "grad": wobble(1.0, 0.1),
        "update": wobble(0.01, 0.05),
        "weight": weight,
        "exp_avg": wobble(0.3, 0.05),
        "exp_avg_sq": wobble(1.0, 0.05),
        "attention_logit": np.full((T, u), np.nan),
        "output_lse": np.full((T, u), np.nan),
    }
    stats["attention_logit"][:, 1] = 5.0 + rng.normal(0, 0.1, T)
    stats["output_lse"][:, 4] = 6.0 + rng.normal(0, 0.02, T)
    keys = lr_key or ["embed", "blocks.0", "blocks.0", "blocks.1", "head"]
    lrs = {k: np.full(T, 1e-3) for k in set(keys) if k is not None}
    return SpikeWindow(np.arange(100, 100 + T), 100 + SPIKE, list(UNITS), stats, lrs, keys,
                       np.full(T, 2.0), np.full((T, 2), np.nan))


@pytest.fixture(params=[0, 1, 2], ids=["seed0", "seed1", "seed2"])
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(request.param)


def test_a_corrupted_weight_is_named_at_the_step_its_norm_jumped(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["weight"][SPIKE:, 2] *= 3.0  # written between steps: its update stayed 1e-2
    w.stats["grad"][SPIKE:, :] *= 20  # and the spike's gradients everywhere
    v = attribute(w)
    assert (v.cause, v.first_mover, v.lead_steps) == ("corrupted_weight", "blocks.0.mlp", 0)
    assert v.figures["relative_change"] == pytest.approx(2.0, rel=0.01)


def test_a_weight_moved_by_its_own_update_is_not_corrupted(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["weight"][SPIKE:, 2] *= 1.05
    w.stats["update"][SPIKE, 2] = 0.6  # ||dW|| >= | ||W_t|| - ||W_t-1|| | = 0.5
    assert attribute(w).cause != "corrupted_weight"


def test_a_bad_batch_moves_every_gradient_at_the_spike_step_and_nothing_before(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["grad"][SPIKE, :] *= 30
    w.inputs = np.tile([0.0, 127.0], (T, 1))
    w.inputs[SPIKE] = [0.0, 255.0]  # a byte the text never had
    v = attribute(w)
    assert v.cause == "bad_batch" and v.lead_steps == 0
    assert v.figures["share"] == 1.0 and v.figures["inputs_out_of_range"] is True


def test_a_group_learning_rate_jump_names_the_group_a_step_before(rng: np.random.Generator) -> None:
    w = window(rng)
    w.lrs["blocks.0"][SPIKE - 1 :] *= 100
    w.stats["update"][SPIKE - 1 :, 1:3] *= 100
    w.stats["grad"][SPIKE:, :] *= 10
    v = attribute(w)
    assert (v.cause, v.lead_steps) == ("learning_rate", 1)
    assert v.first_mover == "blocks.0"  # both units of the group moved: their module is named
    assert v.figures["lr_ratio"] == pytest.approx(100)


def test_an_update_jump_with_a_flat_gradient_is_the_learning_rate_even_unlogged(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["update"][SPIKE - 2 :, 3] *= 50
    v = attribute(w)
    assert (v.cause, v.first_mover, v.lead_steps) == ("learning_rate", "blocks.1.mlp", 2)
    assert "lr_ratio" not in v.figures


def test_a_gradient_returning_into_a_decayed_second_moment(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["grad"][: SPIKE - 3, 3] = 0.0  # near zero for the whole window before
    w.stats["exp_avg_sq"][:, 3] = 1e-6
    w.stats["exp_avg_sq"][SPIKE - 3 :, 3] = 1e-3 * 1.0  # (1 - beta2) g^2 after the return
    w.stats["update"][SPIKE - 3 :, 3] *= 30
    v = attribute(w)
    assert (v.cause, v.first_mover, v.lead_steps) == ("adam_second_moment", "blocks.1.mlp", 3)
    assert v.figures["grad_sq_over_exp_avg_sq"] == pytest.approx(1000, rel=0.3)


def test_a_gradient_that_grows_into_a_healthy_second_moment_is_not_adam(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["grad"][SPIKE - 3 :, 3] *= 20
    w.stats["exp_avg_sq"][SPIKE - 3 :, 3] *= 400  # v follows the gradient: ratio stays ~1
    assert attribute(w).cause == "unknown"


def test_attention_logits_growing_step_by_step_are_found_from_where_they_started(rng: np.random.Generator) -> None:
    w = window(rng)
    start = SPIKE - 6
    w.stats["attention_logit"][start:, 1] = 5.0 * 1.5 ** np.arange(1, T - start + 1)
    v = attribute(w)
    assert (v.cause, v.first_mover) == ("attention_logits", "blocks.0.attn")
    assert abs(v.lead_steps - (SPIKE - start)) <= 2


def test_a_drifting_output_log_sum_exp(rng: np.random.Generator) -> None:
    w = window(rng)
    w.stats["output_lse"][SPIKE - 4 :, 4] = 6.0 + 1.0 * np.arange(1, T - SPIKE + 5)
    v = attribute(w)
    assert (v.cause, v.first_mover) == ("output_logits", "head")
    assert abs(v.lead_steps - 4) <= 2


def _every_other_step(w: SpikeWindow, stat: str, unit: int, measured: int) -> None:
    """Blank the series at the window's steps of the other parity: a series with a gap at every
    other step (the logits as they were when taken on alternate steps, docs/spikes.md, cost)."""
    w.stats[stat][(w.steps % 2) != measured, unit] = np.nan


@pytest.mark.parametrize("start", [SPIKE - 6, SPIKE - 5], ids=["starts-measured", "starts-between"])
@pytest.mark.parametrize("stat,unit,cause,mover,measured", [
    ("attention_logit", 1, "attention_logits", "blocks.0.attn", 0),
    ("output_lse", 4, "output_logits", "head", 1),
], ids=["attention-even-steps", "output-odd-steps"])
def test_a_logit_series_with_gaps_is_found_at_the_first_measured_step_of_its_climb(
        rng: np.random.Generator, start: int, stat: str, unit: int, cause: str, mover: str, measured: int) -> None:
    w = window(rng)
    level = w.stats[stat][0, unit]
    w.stats[stat][start:, unit] = level + 1.5 * level * (1.3 ** np.arange(1, T - start + 1) - 1)
    _every_other_step(w, stat, unit, measured)
    v = attribute(w)
    assert (v.cause, v.first_mover) == (cause, mover)
    onset = SPIKE - v.lead_steps
    assert onset >= start and onset - start <= 1, "not the first measured step of the climb"
    assert np.isfinite(w.stats[stat][onset, unit])
    assert "nan" not in v.why, v.why  # the value before is the last one measured


def test_an_unmeasured_step_inside_a_climb_does_not_make_it_a_blip(rng: np.random.Generator) -> None:
    """Regression: a nan between the onset and the spike (a step with no update measured) read
    as the series coming back, and the departure was dropped."""
    w = window(rng)
    w.stats["update"][SPIKE - 3 :, 3] *= 50
    w.stats["update"][SPIKE - 1, 3] = np.nan
    v = attribute(w)
    assert (v.cause, v.first_mover, v.lead_steps) == ("learning_rate", "blocks.1.mlp", 3)


def test_a_quiet_window_names_no_cause(rng: np.random.Generator) -> None:
    v = attribute(window(rng))
    assert v.cause == "unknown" and v.first_mover is None


def test_per_unit_folds_l2_norms_and_sums() -> None:
    values = np.array([[3.0, 4.0, 1.0]])
    np.testing.assert_allclose(per_unit(values, [0, 0, 1], 3), [[5.0, 1.0, np.nan]])
    assert per_unit(values, [0, 0, 1], 2, "sum").tolist() == [[7.0, 1.0]]


@pytest.mark.parametrize("z,expected", [(6.0, [70]), (1000.0, [])], ids=["default", "high"])
def test_the_robust_watch_reports_one_spike_per_episode(z: float, expected: list[int]) -> None:
    rng = np.random.default_rng(1)
    loss = 2.0 + rng.normal(0, 0.05, 120)
    loss[70:73] = 5.0  # one episode of three steps
    watch = RobustLossWatch(z=z)
    found = [s.step for i, x in enumerate(loss) if (s := watch.add(i, float(x))) is not None]
    assert found == expected


def test_the_robust_watch_waits_for_its_warm_up() -> None:
    watch = RobustLossWatch()
    assert all(watch.add(i, 1.0 if i < 63 else 100.0) is None for i in range(64))  # not judged yet
    assert watch.add(64, 1.0) is None
    spike = watch.add(65, 100.0)
    assert spike is not None and spike.median == 1.0 and spike.baseline_steps == 65
