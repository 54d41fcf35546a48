"""A recommender library's binary output block ends in a sigmoid, and its default loss was
``BCEWithLogitsLoss``, which applies the sigmoid again: every prediction is squeezed into [0.5,
0.73], the loss cannot go below ~0.5 and the gradient is damped. The fix (merged): make the
default loss ``BCELoss`` for the sigmoid output.

Source: NVIDIA-Merlin/models#1175 "Change default loss in BinaryOutput to BCELoss" ("Currently
it's BCEWithLogitsLoss which means we apply sigmoid twice"), https://github.com/NVIDIA-Merlin/models/pull/1175 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/NVIDIA-Merlin/models/pull/1175"
CLASS = "probabilities fed to a loss that expects logits"
KIND, MODULE, CAUSE, ONSET = "probabilities_as_logits", "output.1", None, 0


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = nn.Embedding(40, 8)
        self.item = nn.Embedding(60, 8)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.output = nn.Sequential(nn.Linear(32, 1), nn.Sigmoid())  # BinaryOutput: a sigmoid head

    def forward(self, u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return self.output(self.body(torch.cat([self.user(u), self.item(i)], -1))).squeeze(-1)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = TwoTower()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    criterion = nn.BCEWithLogitsLoss() if bug else nn.BCELoss()  # the bug: the old default
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            u, i = torch.randint(0, 40, (64,), generator=g), torch.randint(0, 60, (64,), generator=g)
            clicked = ((u % 5) + (i % 5) > 4).float()  # users and items with a taste in common
            opt.zero_grad()
            criterion(model(u, i), clicked).backward()
            opt.step()
            watch(s)
        return s.report()
