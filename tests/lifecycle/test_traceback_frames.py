"""A NonFiniteError shows the user's line, torch's frames and at most a few of the sentinel's:
the rows drained, batches reduced and faults located below the hook where the user's call
entered are taken off its traceback (it was 7 to 8 frames of ours at every raise site)."""

from __future__ import annotations

import math
import os
import traceback
from typing import Callable

import pytest
import torch
from helpers import Scale
from torch import nn

import torch_sentinel

PACKAGE = os.path.dirname(os.path.abspath(torch_sentinel.__file__)) + os.sep
#: issue 22: at most 5 frames of sentinel code under the user's line.
MAX_OURS = 5


def _custom() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), Scale(), nn.Linear(8, 2))


def _standard() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


Plant = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _nan_in_layer(model: nn.Module, x: torch.Tensor, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    model[1].factor.fill_(math.nan)  # found by the forward hooks
    return x, loss


def _nan_in_weight(model: nn.Module, x: torch.Tensor, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        model[0].bias[0] = math.nan  # an ordinary step: seen at the output, localised by a rerun
    return x, loss


def _nan_in_data(model: nn.Module, x: torch.Tensor, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone()
    x[0, 0] = math.nan
    return x, loss


CASES: dict[str, tuple[Callable[[], nn.Module], str, int, str]] = {
    # name: (model, check mode, step of the fault, what plants it)
    "forward-hook-immediate": (_custom, "immediate", 2, "layer"),
    "forward-rerun-immediate": (_standard, "immediate", 33, "weight"),  # 33: not a sampled step
    "data-immediate": (_custom, "immediate", 2, "data"),
    "loss-immediate": (_custom, "immediate", 2, "loss"),
    "optimizer-step-immediate": (_custom, "immediate", 2, "grad"),
    "forward-deferred": (_custom, "deferred", 2, "layer"),
    "loss-deferred": (_custom, "deferred", 2, "loss"),
    "flush-deferred": (_custom, "deferred", 2, "flush"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_nonfinite_error_shows_few_frames_of_ours(case: str) -> None:
    make, check, at, plant = CASES[case]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, check=check) as s, pytest.raises(torch_sentinel.NonFiniteError) as info:
        for step in range(at + 3):
            x = torch.randn(3, 4, generator=g)
            if step == at and plant == "layer":
                _nan_in_layer(model, x, x)
            if step == at and plant == "weight":
                _nan_in_weight(model, x, x)
            if step == at and plant == "data":
                x, _ = _nan_in_data(model, x, x)
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            if step == at and plant == "loss":
                loss = loss * math.nan
            loss.backward()
            if step == at and plant == "grad":
                model[2].weight.grad[0, 0] = math.inf
            if step == at and plant == "flush":
                model[2].weight.grad[0, 0] = math.inf
                opt.step()
                s.flush()  # the row of this step lands here: raised from the user's call
            opt.step()
    frames = traceback.extract_tb(info.value.__traceback__)
    ours = [f"{f.filename[len(PACKAGE):]}:{f.lineno} {f.name}" for f in frames if f.filename.startswith(PACKAGE)]
    # a weight made non-finite between steps is charged to the update before it
    assert info.value.step == (at - 1 if plant == "weight" else at)
    assert 1 <= len(ours) <= MAX_OURS, ours
    assert frames[0].filename == __file__  # the user's own line comes first
    if case == "forward-rerun-immediate":
        assert "again" in info.value.evidence["located_by"]  # the rerun located it
