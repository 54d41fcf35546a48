"""Cause before symptom (issue 12): a NonFiniteError ranks the likely causes from evidence the
sentinel already holds, names the first, and never contradicts its own thresholds."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel.detectors.base import RunContext
from torch_sentinel.detectors.nonfinite import NonFiniteDiagnosis, _ratio_hint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 10, generator=g)
    return x, 3 * x[:, :1]


def _exploding_lr_schedule() -> None:
    """A warm-up lambda that multiplies instead of capping: the lr grows 1.6x every step."""
    model, (x, y) = _mlp(), _data()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.6**s)
    with torch_sentinel.attach(model, opt):
        for step in range(300):
            i = torch.arange(32) + (step % 8) * 32
            opt.zero_grad()
            nn.functional.mse_loss(model(x[i]), y[i]).backward()
            opt.step()
            sched.step()


def _fixed_lr_too_high() -> None:
    model, (x, y) = _mlp(), _data()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    with torch_sentinel.attach(model, opt):
        for step in range(100):
            i = torch.arange(32) + (step % 8) * 32
            opt.zero_grad()
            nn.functional.mse_loss(model(x[i]), y[i]).backward()
            opt.step()


def _lbfgs_closure_without_zero_grad() -> None:
    model, (x, y) = _mlp(), _data()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    with torch_sentinel.attach(model, opt):
        for _ in range(100):
            def closure() -> torch.Tensor:
                loss = nn.functional.mse_loss(model(x), y)  # the bug: no opt.zero_grad() here
                loss.backward()
                return loss
            opt.step(closure)


def _log_of_zero_in_the_loss() -> None:
    """A healthy run whose hand-written loss takes log(p) and meets p == 0 at step 30."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(2)
    with torch_sentinel.attach(model, opt):
        for step in range(60):
            x = torch.randn(32, 10, generator=g)
            y = (x[:, 0] > 0).long()
            p = model(x).softmax(-1)
            if step == 30:
                p = p * (torch.arange(3) != 0)  # a masking bug zeroes class 0's probability
            opt.zero_grad()
            nn.functional.nll_loss(p.log(), y).backward()
            opt.step()


CASES: dict[str, tuple[Callable[[], None], str, str]] = {
    "exploding_lr_schedule": (_exploding_lr_schedule, "learning_rate", "lower_learning_rate"),
    "fixed_lr_too_high": (_fixed_lr_too_high, "learning_rate", "lower_learning_rate"),
    "lbfgs_closure_without_zero_grad": (_lbfgs_closure_without_zero_grad, "accumulating_gradients",
                                        "clear_gradients_every_step"),
    "log_of_zero_in_the_loss": (_log_of_zero_in_the_loss, "local_loss", "inspect_loss_definition"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_nonfinite_error_names_the_cause_first(case: str) -> None:
    program, cause, check = CASES[case]
    with pytest.raises(torch_sentinel.NonFiniteError, match=r"first appeared at step \d+.*likely cause: ") as info:
        program()
    err = info.value
    assert err.evidence["likely_cause"] == cause, err.evidence["likely_causes"]
    ranked = [c["cause"] for c in err.evidence["likely_causes"]]
    assert ranked[0] == cause and len(ranked) == len(set(ranked))
    if cause == "learning_rate":
        assert "learning rate is too high" in str(err) and "log of a probability" not in str(err).split("(2)")[0]
        assert err.evidence["likely_causes"][0]["evidence"]  # the figures behind it
    if cause == "local_loss":
        assert err.step == 30 and err.boundary == "loss"
    finding = NonFiniteDiagnosis(RunContext([], {}, [], {}, set(), list)).finding(err)
    assert finding.next_check == check and finding.evidence["likely_cause"] == cause


@pytest.mark.parametrize("ratio,words", [(0.0, "below the healthy band"), (1e-3, "inside the healthy band"),
                                         (0.8, "above the healthy band")], ids=["zero", "healthy", "high"])
def test_update_ratio_hint_never_contradicts_the_band(ratio: float, words: str) -> None:
    """Regression (issue 12): "update/weight ratio 0 ... the learning rate looks sane"."""
    text = _ratio_hint({"step": 10, "ratio": ratio, "max_ratio": ratio, "max_ratio_param": "0.weight"}, (1e-7, 0.1))
    assert words in text and "sane" not in text


def test_a_ratio_inside_the_band_is_never_called_above_it() -> None:
    """Issue 25: "an update/weight ratio of 0.007 ... above the healthy band": the verdict was read
    on the largest single-parameter ratio (an output bias) while the message printed the global one."""
    text = _ratio_hint({"step": 40, "ratio": 0.007, "of": "the layer weights", "max_ratio": 1.21,
                        "max_ratio_param": "2.bias"}, (1e-7, 0.1))
    assert "0.007" in text and "inside the healthy band" in text and "above" not in text


def _bias_heavy_log_of_zero() -> None:
    """A healthy regression head whose output bias moves by a large fraction of itself (a bias
    near 0 has no scale), then a log of 0 in a hand-written loss at step 25."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1))
    nn.init.zeros_(model[2].bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    with torch_sentinel.attach(model, opt, update_every=1):
        for step in range(40):
            x = torch.randn(32, 10, generator=g)
            p = torch.sigmoid(model(x)).squeeze(1)
            if step == 25:
                p = torch.where(x[:, 0] > 0, torch.ones_like(p), p)  # sigmoid saturated at exactly 1
            y = (x[:, 0] > 0).float()
            opt.zero_grad()
            (-(y * p.log() + (1 - y) * (1 - p).log()).mean()).backward()
            opt.step()


def test_a_single_bias_ratio_is_not_the_models_ratio() -> None:
    with pytest.raises(torch_sentinel.NonFiniteError) as info:
        _bias_heavy_log_of_zero()
    err = info.value
    assert err.boundary == "loss" and err.evidence["likely_cause"] == "local_loss", err.evidence["likely_causes"]
    before = err.evidence["update_ratio_before"]
    assert before["of"] == "the layer weights" and before["ratio"] < 0.1


def test_a_non_finite_target_is_the_data_ahead_of_any_dynamics() -> None:
    """Where the first non-finite value appeared comes first: a target that was already
    non-finite (a log of 0 in preprocessing) is the data, whatever the trends say."""
    from torch_sentinel.diagnosis.causes import rank_causes

    causes = rank_causes("loss", {"loss_input_nonfinite": "target"}, [], 15, local="the loss")
    assert causes[0].name == "data" and "preprocessing" in causes[0].text
