"""probabilities_as_logits and loss_broadcast: what the loss function was given."""

from __future__ import annotations

import warnings
from typing import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Functional losses are looked up at call time (as ``F.mse_loss(...)`` in a loop is), so the
# cases below wrap them in lambdas rather than capturing the function objects at import.

CLASSIFIERS: dict[str, tuple[nn.Module, LossFn, bool]] = {
    "softmax_module_into_cross_entropy": (nn.Softmax(dim=1), nn.CrossEntropyLoss(), True),
    "softmax_into_nll_loss": (nn.Softmax(dim=1), lambda x, y: F.nll_loss(x, y), True),
    "log_softmax_into_nll_loss": (nn.LogSoftmax(dim=1), lambda x, y: F.nll_loss(x, y), False),
    "logits_into_cross_entropy": (nn.Identity(), lambda x, y: F.cross_entropy(x, y), False),
}


@pytest.mark.parametrize("case", list(CLASSIFIERS), ids=list(CLASSIFIERS))
def test_probabilities_fed_to_a_logit_loss(case: str) -> None:
    last, loss_fn, fires = CLASSIFIERS[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(6):
            opt.zero_grad()
            loss_fn(model(torch.randn(8, 6)), torch.randint(0, 5, (8,))).backward()
            opt.step()
        report = s.report()
    hits = report.by_kind("probabilities_as_logits")
    assert bool(hits) is fires
    if fires:
        f = hits[0]
        assert f.module == "1" and f.boundary == "loss"
        assert f.evidence["min"] >= 0 and f.evidence["max_rowsum_deviation"] < 1e-3
        assert f.evidence["probes_matching"] == 5  # steps 0-4 were probed


def test_validation_under_no_grad_is_not_probed() -> None:
    model = nn.Sequential(nn.Linear(6, 5), nn.Softmax(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        with torch.no_grad():
            for _ in range(6):
                F.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 5, (8,)))
        assert s.report().by_kind("probabilities_as_logits") == []


SHAPES = {
    "column_vs_vector": ((16, 1), (16,), True),
    "vector_vs_column": ((16,), (16, 1), True),
    "same_shape": ((16, 1), (16, 1), False),
    "scalar_target": ((16, 1), (), False),
}


@pytest.mark.parametrize("case", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("fn", [lambda x, y: F.mse_loss(x, y), lambda x, y: F.l1_loss(x, y), nn.SmoothL1Loss()],
                         ids=["mse", "l1", "smooth_l1_module"])
def test_loss_broadcast(case: str, fn: LossFn) -> None:
    out_shape, target_shape, fires = SHAPES[case]
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.01)) as s:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(torch.randn(16, 3)).reshape(out_shape)
            fn(out, torch.randn(target_shape) if target_shape else torch.tensor(0.5)).backward()
        report = s.report()
    hits = report.by_kind("loss_broadcast")
    assert bool(hits) is fires
    if fires:
        assert hits[0].boundary == "shapes" and hits[0].evidence["broadcast_shape"] == [16, 16]
        assert report.boundary == "shapes"
