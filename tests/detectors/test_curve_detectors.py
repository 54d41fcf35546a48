"""overfitting, diverging, plateau, amp_skips: table-driven on synthetic step records."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pytest
import torch

import torch_sentinel
from torch_sentinel._collect.ledger import Ledger
from torch_sentinel._record import StepMeta, StepRecord
from torch_sentinel.detectors.amp_skips import AmpSkipsDetector
from torch_sentinel.detectors.base import Detector, RunContext
from torch_sentinel.detectors.diverging import DivergingDetector
from torch_sentinel.detectors.overfitting import OverfittingDetector
from torch_sentinel.detectors.plateau import PlateauDetector

_LEDGER = Ledger(torch.device("cpu"))
_LEDGER.add_block("loss", ["auto", "explicit", "validation"])
_LEDGER.add_block("misc", ["stale_grad_norm", "amp_scale"])


def record(step: int, loss: float, val: Optional[float] = None, skipped: bool = False) -> StepRecord:
    values = np.zeros(_LEDGER.width, dtype=np.float32)
    values[0] = loss
    meta = StepMeta(step=step, backward_calls=1, validation=val, amp_skipped=skipped)
    return StepRecord(meta, values, _LEDGER.blocks)


def ctx(**thresholds: float) -> RunContext:
    return RunContext(module_names=[], module_types={}, param_names=[], param_owner={},
                      optimizer_params=set(), forward_order=list, thresholds=dict(thresholds))


def bound(cls: type[Detector], context: RunContext) -> Detector:
    detector = cls()
    detector.bind(context)
    return detector


def run(detector: Detector, records: list[StepRecord], window: int = 10) -> list:
    """Feed the records a flush window at a time, as the sentinel does."""
    found = []
    for i in range(0, len(records), window):
        for rec in records[i : i + window]:
            detector.update(rec)
        found += [*detector.conclude(), *detector.take_flagged()]
    return [*found, *detector.conclude(final=True), *detector.take_flagged()]


rng = np.random.default_rng(0)
NOISE = rng.normal(0, 0.02, 200)

CURVES = {
    # name: (train losses, validation every 10 steps or None, expected kinds)
    "healthy_decay": ([2.0 * math.exp(-s / 30) + 0.1 + NOISE[s] for s in range(120)],
                      lambda s: 2.0 * math.exp(-s / 30) + 0.3, set()),
    "overfit": ([2.0 * math.exp(-s / 20) + 0.01 for s in range(120)],
                lambda s: 1.0 + 0.5 * max(0, s - 40) / 10 if s > 40 else 2.0 - s / 40, {"overfitting"}),
    # Regression (a healthy fresh-data run, 300 steps): validation bumps 30% over two points but
    # stays below the training loss, which keeps falling: no generalization gap.
    "val_bump_below_train": ([0.3 - s / 1000 for s in range(120)],
                             lambda s: [1.0, .8, .6, .4, .2, .15, .13, .12, .105, .135, .14, .11][s // 10], set()),
    # Regression: both losses bump together (an lr bump), validation far above training: compared
    # with the whole run before the best point, the training loss looked as if it still fell.
    "both_losses_bump": ([2.0 * math.exp(-s / 20) + 0.01 + (0.05 if 90 <= s < 110 else 0.0) for s in range(120)],
                         lambda s: [2.0, 1.6, 1.2, 1.0, .8, .7, .6, .55, .5, .6, .62, .5][s // 10], set()),
    "one_bad_validation": ([2.0 * math.exp(-s / 20) + 0.01 for s in range(120)],
                           lambda s: 3.0 if s == 59 else 1.0 - s / 400, set()),
    "diverging": ([1.0 * 1.15**s for s in range(40)], None, {"diverging"}),
    "spike_then_recover": ([1.0 - s / 100 + (2.0 if 20 <= s <= 21 else 0.0) for s in range(60)], None, set()),
    "flat_at_chance": ([math.log(10) + NOISE[s] for s in range(40)], None, {"plateau"}),
    "learns_then_levels_off": ([max(0.2, 2.3 - s / 10) + NOISE[s] for s in range(100)], None, set()),
}


@pytest.mark.parametrize("case", list(CURVES), ids=list(CURVES))
def test_curves(case: str) -> None:
    train, val, expected = CURVES[case]
    records = [record(s, x, val(s) if val is not None and s % 10 == 9 else None) for s, x in enumerate(train)]
    kinds = set()
    for cls in (OverfittingDetector, DivergingDetector, PlateauDetector):
        for f in run(bound(cls, ctx()), records):
            kinds.add(f.kind)
            assert f.boundary == "curves" and f.step is not None
    assert kinds == expected


def test_overfitting_evidence_names_the_turn() -> None:
    train, val, _ = CURVES["overfit"]
    records = [record(s, x, val(s) if s % 10 == 9 else None) for s, x in enumerate(train)]
    (f,) = run(bound(OverfittingDetector, ctx()), records)
    assert f.evidence["best_step"] == 39 and f.evidence["last_validation"] > f.evidence["best_validation"] * 1.1


def test_plateau_threshold_is_configurable() -> None:
    records = [record(s, 2.0 - 0.004 * s) for s in range(40)]  # 5% better by step 30
    assert [f.kind for f in run(bound(PlateauDetector, ctx()), records)] == []
    assert [f.kind for f in run(bound(PlateauDetector, ctx(**{"plateau.improvement": 0.08})), records)] == ["plateau"]


@pytest.mark.parametrize(("skips", "fires"), [(29, False), (30, True)], ids=["29_skips", "30_skips"])
def test_amp_skips(skips: int, fires: bool) -> None:
    records = [record(s, 1.0, skipped=s < skips) for s in range(40)]
    found = run(bound(AmpSkipsDetector, ctx()), records)
    assert bool(found) is fires
    if fires:
        assert found[0].evidence["consecutive_skips"] == 30 and found[0].step == 29


def _curriculum_run(scale: float) -> torch_sentinel.Report:
    """A real regression MLP on a curriculum: the first 4 steps see shrunken targets, so the loss
    rises when the full targets arrive and then falls to a fraction of its start."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(512, 8, generator=g)
    y_all = x_all @ (torch.randn(8, 1, generator=g) * 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(60):
            idx = torch.arange(64) + (step % 8) * 64
            y = y_all[idx] * (scale if step < 4 else 1.0)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x_all[idx]), y).backward()
            opt.step()
        return s.report()


def _lr_run(lr: float) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(512, 20, generator=g)
    y_all = x_all[:, :10].argmax(1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(60):
            idx = torch.arange(64) + (step % 8) * 64
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
        return s.report()


def test_diverging_never_reads_the_future_on_a_real_model() -> None:
    """Regression (issue 12): a brief early rise was called diverging "from a low" that the run
    only reached 40 steps later in the same flush window."""
    report = _curriculum_run(0.5)
    assert report.by_kind("diverging") == [], [str(f) for f in report.findings]


def test_diverging_catches_a_real_early_climb() -> None:
    (f,) = _curriculum_run(0.2).by_kind("diverging")  # targets x5 after step 4: a real climb
    assert f.onset_step is not None and f.step is not None and f.step - f.onset_step <= 20


@pytest.mark.parametrize("lr", [0.3, 1.0], ids=["adam_lr_0.3", "adam_lr_1"])
def test_diverging_catches_a_jump_at_step_one_that_never_comes_back(lr: float) -> None:
    """Regression (issue 12): the spike sat in the first smoothed point, so the curve never rose
    above its own start."""
    (f,) = _lr_run(lr).by_kind("diverging")
    assert f.onset_step == 1 and f.step is not None and f.step <= 20
    assert f.evidence["lowest_loss_since"] >= 2 * f.evidence["first_loss"]


def test_diverging_quiet_at_a_sane_learning_rate() -> None:
    assert _lr_run(1e-3).by_kind("diverging") == []


def _lr_record(step: int, loss: float, lr: float) -> StepRecord:
    rec = record(step, loss)
    rec.meta.lrs = [lr]
    return rec


@pytest.mark.parametrize("case", ["rl_surrogate", "outlier_count", "negative_nll"],
                         ids=["rl_surrogate_changes_sign", "robust_loss_outlier_count", "negative_log_likelihood"])
def test_losses_not_meant_to_fall_smoothly_are_not_diverging(case: str) -> None:
    """Issue 25: a policy-gradient surrogate (noisy, changes sign), a robust loss whose batch value
    depends on how many outliers the batch holds (binomial), and a density model's loss that goes
    negative are compared like with like (equal windows, their own noise band): no fault."""
    gen = np.random.default_rng(1)
    if case == "rl_surrogate":
        losses = list(gen.normal(0.0, 1.0, 300) + 0.3 * np.sin(np.arange(300) / 15))
    elif case == "outlier_count":
        losses = list(0.5 + 1.23 * gen.binomial(32, 0.08, 300) * np.exp(-np.arange(300) / 400))
    else:
        losses = list(1.1 - 3.0 * (1 - np.exp(-np.arange(300) / 60)) + gen.normal(0, 0.15, 300))
    found = run(bound(DivergingDetector, ctx()), [record(s, x) for s, x in enumerate(losses)])
    assert [f for f in found if f.is_fault] == []


def test_a_climb_without_update_side_instability_is_info() -> None:
    """The loss doubles (a value loss whose targets grow as the policy improves), but no update
    figure says the optimizer is unstable: the finding is info, never the error."""
    losses = [10.0 + 0.01 * s for s in range(20)] + [25.0 + 0.05 * s for s in range(20)]
    (f,) = run(bound(DivergingDetector, ctx()), [record(s, x) for s, x in enumerate(losses)])
    assert f.severity == "info" and "not an unstable optimizer" in f.message


def test_plateau_waits_for_the_warm_up_and_for_a_slow_start() -> None:
    """A fine-tune whose loss sits at ln 2 while the lr warms up over 30 steps, then falls; and a
    slow starter flat for its first 28 steps (InfoNCE at its published lr)."""
    warm = [_lr_record(s, 0.693 + NOISE[s] / 10 if s < 45 else 0.693 - 0.01 * (s - 45), min(1.0, (s + 1) / 30))
            for s in range(100)]
    assert run(bound(PlateauDetector, ctx()), warm) == []
    slow = [record(s, 4.14 + NOISE[s] * 4 if s < 28 else 4.14 - 0.03 * (s - 28)) for s in range(100)]
    assert run(bound(PlateauDetector, ctx()), slow) == []


def test_a_long_converged_run_is_not_a_plateau_once_the_history_forgets_its_start() -> None:
    """The loss history is bounded (256 steps); a run that learned in its first 100 steps and
    then sat at its floor for 900 more is converging, not stuck."""
    gen = np.random.default_rng(2)
    losses = [max(0.2, 2.3 - s / 40) + gen.normal(0, 0.01) for s in range(1000)]
    assert run(bound(PlateauDetector, ctx()), [record(s, x) for s, x in enumerate(losses)]) == []
