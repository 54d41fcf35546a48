"""saturation: hidden sigmoid/tanh units at their flat ends; output activations are exempt."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel

CASES = {
    # name: (activation, init std of the layer before it, fires)
    "tanh_std2": (nn.Tanh, 2.0, True),
    "sigmoid_std2": (nn.Sigmoid, 2.0, True),
    "tanh_default_init": (nn.Tanh, None, False),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_hidden_saturation(case: str) -> None:
    act, std, fires = CASES[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), act(), nn.Linear(32, 2))
    if std is not None:
        nn.init.normal_(model[0].weight, 0.0, std)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(16, 64)).pow(2).mean().backward()
            opt.step()
        hits = s.report().by_kind("saturation")
    assert [f.module for f in hits] == (["1"] if fires else [])
    if fires:
        assert hits[0].evidence["saturated_fraction"] > 0.5 and hits[0].evidence["steps"] == [2, 3, 4]


def test_saturated_output_sigmoid_is_exempt() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1), nn.Sigmoid())
    nn.init.normal_(model[0].weight, 0.0, 1.0)  # a confident classifier: outputs near 0 and 1
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(5):
            x = torch.randn(16, 64)
            opt.zero_grad()
            nn.functional.binary_cross_entropy(model(x), (x[:, :1] > 0).float()).backward()
            opt.step()
        assert s.report().by_kind("saturation") == []
