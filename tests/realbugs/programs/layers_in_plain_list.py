"""A stack of blocks is kept in a plain Python list instead of ``nn.ModuleList``: their
parameters are not registered, ``model.parameters()`` misses them, the optimizer never updates
them, and the network trains only its head.

Source: "ModuleList vs Python list in PyTorch: lost parameters" (a plain list of layers is not
registered, so the optimizer does not update it),
https://runebook.dev/zh/docs/pytorch/generated/torch.nn.modulelist/torch.nn.ModuleList ;
"my model didn't know it had parameters",
https://theflyingbirds.in/blog/pytorch-mysteries-lets-understand-nnmodule-nnparameter-modulelist-sequential-and-the-classic-layers-linear-activations-dropout .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = ("https://runebook.dev/zh/docs/pytorch/generated/torch.nn.modulelist/torch.nn.ModuleList; "
          "https://theflyingbirds.in/blog/pytorch-mysteries-lets-understand-nnmodule-nnparameter-modulelist-sequential-and-the-classic-layers-linear-activations-dropout")
CLASS = "submodules in a plain list (not registered)"
KIND, MODULE, CAUSE, ONSET = "unregistered_parameter", "", None, 0


class Stack(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3)]
        self.blocks = blocks if bug else nn.ModuleList(blocks)  # the bug: a plain list
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Stack(bug)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(32, 16, generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] * x[:, 1] > 0).long()).backward()
            opt.step()
            watch(s)
        return s.report()
