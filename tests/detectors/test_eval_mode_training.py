"""eval_mode_training: steps taken with dropout / batch norm in eval mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))


def _loop(model: nn.Module, steps: int = 6, validate_with_grad: bool = False) -> torch_sentinel.Report:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            if validate_with_grad:  # a validation forward without no_grad, then back to train
                model.eval()
                model(torch.randn(8, 4))
                model.train()
        return s.report()


def test_whole_model_left_in_eval() -> None:
    model = _model()
    model.eval()
    (f,) = _loop(model).by_kind("eval_mode_training")
    assert f.module == "" and f.evidence["model_in_eval"] is True
    assert sorted(f.evidence["modules"]) == ["1", "3"]


def test_one_dropout_in_eval() -> None:
    model = _model()
    model[3].eval()
    (f,) = _loop(model).by_kind("eval_mode_training")
    assert f.module == "3" and f.evidence["modules"] == ["3"]


@pytest.mark.parametrize("case", ["frozen_batchnorm", "validation_forward_with_grad", "train_mode"])
def test_quiet(case: str) -> None:
    model = _model()
    if case == "frozen_batchnorm":
        model[1].requires_grad_(False)
        model[1].eval()
    report = _loop(model, validate_with_grad=case == "validation_forward_with_grad")
    assert report.by_kind("eval_mode_training") == []


def _validation_pass(model: nn.Module, forget: bool) -> None:
    """A mid-run validation pass; ``forget`` leaves out the ``model.train()`` after it."""
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))
    if not forget:
        model.train()


def _assert_reported_from(found: list[Finding], onset: int) -> Finding:
    """One whole-model finding whose evidence began at ``onset``, reported within 20 steps."""
    (f,) = found
    assert f.onset_step == onset and f.step is not None and f.step - onset <= 20
    assert f.module == "" and f.evidence["model_in_eval"] is True
    return f


@pytest.mark.parametrize("forget", [True, False], ids=["train_forgotten", "train_restored"])
def test_train_forgotten_after_a_mid_run_validation(forget: bool) -> None:
    """Regression (issue 12): the flag was sampled at steps 0-4 and every 50th only, so a
    model.train() forgotten after a validation pass at step 23 went unseen until step 50."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(45):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            if step == 23:
                _validation_pass(model, forget)
        found = s.report().by_kind("eval_mode_training")
    if not forget:
        assert found == []
        return
    _assert_reported_from(found, onset=24)


@pytest.mark.parametrize("forget", [True, False], ids=["train_forgotten", "train_restored"])
def test_no_optimizer_hand_written_update(forget: bool) -> None:
    """Regression (issue 12, realworld word_language_model/eval_left_on): attached without an
    optimizer (``p.data.add_(p.grad, alpha=-lr)``), each backward() is a step, and a
    model.eval() left on after a validation pass is reported like with an optimizer."""
    model = _model()
    with torch_sentinel.attach(model) as s:
        for step in range(30):
            model.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
            if step == 9:
                _validation_pass(model, forget)
        found = s.report().by_kind("eval_mode_training")
    if not forget:
        assert found == []
        return
    f = _assert_reported_from(found, onset=10)
    assert "model.train() not called after eval" in f.message
