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


def _rebuild_tolist(out: torch.Tensor) -> torch.Tensor:
    return torch.tensor(out.tolist(), requires_grad=True)


def _rebuild_numpy(out: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(out.detach().numpy().copy()).requires_grad_()


def _rebuild_detach(out: torch.Tensor) -> torch.Tensor:
    return out.detach().requires_grad_()


_REBUILDS = {"tolist": _rebuild_tolist, "numpy_round_trip": _rebuild_numpy, "detach_requires_grad": _rebuild_detach}


@pytest.mark.parametrize("rebuild", list(_REBUILDS), ids=list(_REBUILDS))
def test_graph_cut_by_rebuilding_the_output_is_named(rebuild: str) -> None:
    """Regression (issue 12): reported as no_update "zero_grad after backward" and as an
    unregistered_parameter "<unknown>, plain list?"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            x = torch.randn(16, 4)
            opt.zero_grad()
            out = _REBUILDS[rebuild](model(x))  # the bug
            nn.functional.cross_entropy(out, (x[:, 0] > 0).long()).backward()
            opt.step()
        report = s.report()
    (f,) = report.by_kind("no_gradient")
    assert "new leaf tensor of shape (16, 3)" in f.message and "graph was cut" in f.message
    assert f.module == "" and f.onset_step == 0 and f.step is not None and f.step <= 20
    assert report.by_kind("unregistered_parameter") == []
    assert not any("zero_grad" in g.message for g in report.by_kind("no_update"))
