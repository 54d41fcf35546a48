"""A density-scaling network ends in a functional ReLU to keep its outputs non-negative; with an
unlucky initialisation every output is negative before the ReLU, so the model predicts only
zeros, no gradient flows back through it, and it never recovers. The reporters' fix: a softplus.

Source: jvargasmu/population_estimation#68 "Sometimes the initial solution predicts only zeros
(due to RELU activation). And hence, no gradients emerge. We should maybe change this to a
softRelu/Softplus", https://github.com/jvargasmu/population_estimation/issues/68 ;
keras-team/keras#7057 "detect dead ReLUs", https://github.com/keras-team/keras/issues/7057 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/jvargasmu/population_estimation/issues/68; https://github.com/keras-team/keras/issues/7057"
CLASS = "dead ReLU"
KIND, MODULE, CAUSE, ONSET = "dead_relu", "", None, 0


class ScaleNet(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 4)
        self.bug = bug
        with torch.no_grad():
            self.fc2.bias.fill_(-3.0)  # the unlucky start: every pre-activation below 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.fc2(torch.tanh(self.fc1(x)))
        if self.bug:
            return nn.functional.relu(z)  # the bug: dead from the first step
        return nn.functional.softplus(z)  # the fix


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = ScaleNet(bug)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            x = torch.randn(64, 6, generator=g)
            counts = (x[:, :4].abs() * 3).round()  # non-negative targets
            opt.zero_grad()
            nn.functional.mse_loss(model(x), counts).backward()
            opt.step()
            watch(s)
        return s.report()
