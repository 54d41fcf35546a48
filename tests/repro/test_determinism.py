"""check_determinism: two runs from one seed, and the first step and tensor where they part."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import torch_sentinel


def _train(steps: int = 4, glitch_at: int | None = None, counter: itertools.count | None = None) -> list[dict]:
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = next(counter) if counter is not None else 0
    out = []
    for step in range(steps):
        x = torch.randn(16, 6)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if step == glitch_at and run == 1:
            # An unseeded influence on the second run only: a scatter-add order, a worker...
            with torch.no_grad():
                model[2].weight.add_(1e-6)
        opt.step()
        out.append({"loss": loss.detach(), **{k: v.detach().clone() for k, v in model.state_dict().items()}})
    return out


def test_identical_runs_are_reported_deterministic() -> None:
    report = torch_sentinel.check_determinism(lambda: _train(), runs=3, seed=5)
    assert report.ok and bool(report)
    assert str(report) == "deterministic: 3 runs agree on all 4 steps"


def test_reports_first_step_and_tensor_where_runs_diverge() -> None:
    counter = itertools.count()
    report = torch_sentinel.check_determinism(lambda: _train(glitch_at=2, counter=counter), seed=5)
    assert not report.ok
    assert (report.step, report.name, report.run) == (2, "2.weight", 1)
    assert report.max_abs_diff == pytest.approx(1e-6, rel=0.2)
    assert "runs diverge at step 2, '2.weight'" in str(report)


def test_train_fn_may_take_the_seed_and_return_a_dict_of_series() -> None:
    seen = []

    def train_fn(seed: int) -> dict:
        seen.append(seed)
        return {"loss": [float(torch.rand(()).item()) for _ in range(3)]}

    assert torch_sentinel.check_determinism(train_fn, seed=11).ok
    assert seen == [11, 11]


def test_unseeded_generator_is_caught_at_step_zero() -> None:
    def train_fn() -> list:
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=torch.Generator().manual_seed(
            torch.seed())).item()))
        return [torch.randn(3, generator=g)]

    report = torch_sentinel.check_determinism(train_fn)
    assert (report.step, report.name) == (0, "value")


@pytest.mark.parametrize("runs", [1, 0, True], ids=["one", "zero", "bool"])
def test_needs_two_runs(runs: object) -> None:
    with pytest.raises(ValueError, match="runs >= 2"):
        torch_sentinel.check_determinism(lambda: [], runs=runs)  # type: ignore[arg-type]


def test_rejects_outputs_without_steps() -> None:
    with pytest.raises(TypeError, match="per-step values"):
        torch_sentinel.check_determinism(lambda: 3.0)
