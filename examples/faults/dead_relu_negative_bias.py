"""Fault: dying ReLUs from a bad initialisation (a large negative bias before the ReLU).

Source pattern: DeepDiagnosis/AUTOTRAINER "dead node / dying ReLU"; StackOverflow "all my ReLU
outputs are zero, loss does not change" after a custom init that shifts pre-activations far
below zero.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "dead_relu", "boundary": "forward", "module": "act1"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(64, 4)
        nn.init.constant_(self.fc1.bias, -8.0)  # the bug: every pre-activation is ~ -8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act1(self.fc1(x)))


def run(steps: int = 30, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
