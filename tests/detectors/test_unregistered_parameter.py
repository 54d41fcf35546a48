"""unregistered_parameter: trainable tensors that get gradients but no optimizer updates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel


def _loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 6, input_grad: bool = False) -> torch_sentinel.Report:
    torch.manual_seed(0)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(steps):
            x = torch.randn(8, 4, requires_grad=input_grad)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        return s.report()


class ListNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.extra = [nn.Linear(4, 4)]  # not registered
        self.gains = {"g": torch.ones(4, requires_grad=True)}  # a raw tensor, not registered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra[0](self.inp(x)) * self.gains["g"]


def test_plain_list_and_dict_tensors_are_found_and_located() -> None:
    model = ListNet()
    report = _loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    (f,) = report.by_kind("unregistered_parameter")
    assert f.module == "" and f.step == 0 and f.severity == "error"
    assert set(f.evidence["tensors"]) == {"extra[0].weight", "extra[0].bias", "gains['g']"}
    assert f.evidence["elements"] == 16 + 4 + 4


def test_head_replaced_after_the_optimizer() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model[2] = nn.Linear(8, 2)
    report = _loop(model, opt)
    (f,) = report.by_kind("unregistered_parameter")
    assert f.module == "2" and f.evidence["optimizer_tensors_not_in_model"] == 2
    assert sorted(f.evidence["parameters"]) == ["2.bias", "2.weight"]
    # the orphaned old head gets no gradient, but that is this finding's evidence, not a graph cut
    assert report.by_kind("no_gradient") == [] and report.by_kind("missing_zero_grad") == []


def test_inputs_that_require_grad_are_not_parameters() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    report = _loop(model, torch.optim.SGD(model.parameters(), lr=0.1), input_grad=True)
    assert report.by_kind("unregistered_parameter") == []


def test_head_replaced_after_attach_is_named() -> None:
    """A submodule replaced after attach: named, not '<unknown>' nor a cut graph."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt) as sentinel:
        model[2] = nn.Linear(8, 2)  # a new head, after attach
        opt.param_groups[0]["params"] = list(model.parameters())
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 4, generator=g)).pow(2).mean().backward()
            opt.step()
        report = sentinel.report(all_ranks=False)
    late = report.by_kind("unregistered_parameter")
    assert late and "2.weight" in late[0].message and "after attach" in late[0].message
    assert "<unknown>" not in str(report)
    assert not [f for f in report.by_kind("no_gradient") if "cut" in f.message]


@pytest.mark.parametrize("added", [True, False], ids=["add_param_group", "unfrozen_but_never_added"])
def test_parameters_joining_through_add_param_group_are_registered(added: bool) -> None:
    """Gradual unfreezing (Lightning's BaseFinetuning): a frozen block's parameters get
    requires_grad and join the optimizer mid-run with add_param_group. The optimizer's groups are
    read as the run goes, so they are registered from that step; unfrozen but never added, they
    are reported. The frozen block still holds the .grad of an earlier phase, which is no gradient."""
    torch.manual_seed(0)
    backbone, head = nn.Linear(8, 16), nn.Linear(16, 2)
    model = nn.Sequential(backbone, nn.ReLU(), head)
    model(torch.randn(4, 8)).sum().backward()  # an earlier phase left gradients on the backbone
    for p in backbone.parameters():
        p.requires_grad = False
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(20):
            if step == 8:
                for p in backbone.parameters():
                    p.requires_grad = True
                if added:
                    opt.add_param_group({"params": list(backbone.parameters()), "lr": 0.01})
            x = torch.randn(16, 8)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        found = s.report().by_kind("unregistered_parameter")
    if added:
        assert found == []
    else:
        (f,) = found
        assert f.module == "0" and f.step == 8 and f.severity == "error"
