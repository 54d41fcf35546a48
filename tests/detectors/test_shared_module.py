"""shared_module: one module instance registered under several names, found at attach."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class Stack(nn.Module):
    """zalandoresearch/pytorch-vq-vae#2: ``nn.ModuleList([Residual()] * n)`` repeats one instance."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Residual()] * 3 if shared else [Residual() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _attach_findings(model: nn.Module, **kwargs: object) -> list[torch_sentinel.Finding]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, **kwargs) as s:  # type: ignore[arg-type]
        return list(s.findings)  # the structural verdicts, before any step


def test_list_multiplication_is_found_naming_every_name() -> None:
    (f,) = _attach_findings(Stack(shared=True))
    assert (f.kind, f.boundary, f.severity, f.step) == ("shared_module", "shapes", "warning", 0)
    assert f.module == "layers.0" and f.evidence["names"] == ["layers.0", "layers.1", "layers.2"]
    assert f.evidence["module_type"] == "Residual" and f.evidence["uses"] == 3
    assert "'layers.1'" in f.message and "disable={'shared_module'}" in f.message


@pytest.mark.parametrize("case", ["separate_instances", "tied_weights", "shared_activation", "disabled"],
                         ids=["separate_instances", "tied_weights", "shared_activation", "disabled"])
def test_what_is_not_a_shared_module(case: str) -> None:
    if case == "separate_instances":
        assert _attach_findings(Stack(shared=False)) == []
    elif case == "tied_weights":
        emb, out = nn.Embedding(10, 4), nn.Linear(4, 10)
        out.weight = emb.weight  # weight tying: one parameter, two different modules
        assert _attach_findings(nn.Sequential(emb, out)) == []
    elif case == "shared_activation":
        act = nn.ReLU()  # no parameters: sharing it changes nothing
        assert _attach_findings(nn.Sequential(nn.Linear(4, 4), act, nn.Linear(4, 4), act)) == []
    else:
        assert _attach_findings(Stack(shared=True), disable={"shared_module"}) == []


def test_a_shared_container_is_reported_once_not_for_each_child() -> None:
    mlp = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 8))
    model = nn.Module()
    model.in_mlps = nn.ModuleList([mlp, mlp])  # ddsp_pytorch#37: one MLP for two features
    model.out = nn.Linear(16, 1)
    (f,) = _attach_findings(model)
    assert f.module == "in_mlps.0" and f.evidence["names"] == ["in_mlps.0", "in_mlps.1"]
