"""Fault: ReLUs applied functionally (``F.relu`` inside ``forward``) are dead from the start: the
layer's weights were initialised in [-0.1, 0] (a typo for [-0.1, 0.1]) and the inputs are
non-negative pixels, so every pre-activation is negative.

Source pattern: DeepDiagnosis "dead node from a bad initialisation"; StackOverflow "ReLU layer
outputs all zeros with my custom init". The ReLU is not a module, so a module-hook-only tool
misses it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel

EXPECTED = {"kind": "dead_relu", "boundary": "forward", "module": "block"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 32)
        nn.init.uniform_(self.fc.weight, -0.1, 0.0)  # the bug: meant (-0.1, 0.1)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x.flatten(1)))


def run(steps: int = 25, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.rand(32, 8, 8)  # pixels in [0, 1]
            opt.zero_grad()
            F.cross_entropy(model(x), torch.randint(0, 10, (32,))).backward()
            opt.step()
        return sentinel.report()
