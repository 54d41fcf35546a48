"""attach(model) without an optimizer: each backward() is a step, so hand-written updates
(p -= lr * p.grad) get curves and gradient checks."""

from __future__ import annotations

import pathlib

import pytest
import torch
from helpers import MLP, make_batch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import torch_sentinel


def _manual_sgd(model: nn.Module, steps: int, nan_at: int = -1) -> list[float]:
    g = torch.Generator().manual_seed(0)
    losses = []
    for i in range(steps):
        x, y = make_batch("mlp", generator=g)
        if i == nan_at:
            x[0, 0] = float("nan")
        loss = nn.functional.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        losses.append(loss.item())
    return losses


def test_each_backward_is_a_step_and_training_is_unchanged(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    plain = MLP()
    model = MLP()
    model.load_state_dict(plain.state_dict())
    expected = _manual_sgd(plain, 12)
    with torch_sentinel.attach(model, log_dir=str(tmp_path)) as s:
        losses = _manual_sgd(model, 12)
        assert s.step == 12
    assert losses == expected
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss/train")] == list(range(12))
    assert [e.value for e in acc.Scalars("loss/train")] == pytest.approx(expected)
    assert [e.step for e in acc.Scalars("grad_norm/global")] == list(range(12))


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
def test_nan_in_a_manual_loop_is_found_at_its_step(check: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    with torch_sentinel.attach(model, check=check) as s, pytest.raises(torch_sentinel.NonFiniteError) as info:
        _manual_sgd(model, 10, nan_at=6)
    assert (info.value.step, info.value.boundary) == (6, "data")
    assert s.nonfinite_raised == 1


def test_a_lr_of_zero_in_a_manual_loop_is_no_update() -> None:
    torch.manual_seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, flush_every=5) as s:
        for _ in range(10):
            x, y = make_batch("mlp", generator=g)
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            # the update is forgotten: weights never change
    assert "no_update" in {f.kind for f in s.report().findings}
