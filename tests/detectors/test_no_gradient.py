"""no_gradient: optimizer parameters that never receive a gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel


class Cut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).detach())


@pytest.mark.parametrize("set_to_none", [True, False], ids=["grad_none", "grad_zero"])
def test_detached_encoder(set_to_none: bool) -> None:
    torch.manual_seed(0)
    model = Cut()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(6):
            opt.zero_grad(set_to_none=set_to_none)
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        report = s.report()
    (f,) = report.by_kind("no_gradient")
    assert f.module == "encoder" and f.boundary == "gradients" and f.evidence["count"] == 4
    assert report.boundary == "gradients" and report.next_check == "inspect_graph_connectivity"


def test_too_few_steps_is_not_evidence() -> None:
    torch.manual_seed(0)
    model = Cut()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        assert s.report().by_kind("no_gradient") == []
