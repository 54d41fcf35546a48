"""Fault: hidden layers kept in a plain Python list are not registered as submodules, so
``model.parameters()`` (and the optimizer) never see them, although they get gradients.

Source pattern: StackOverflow "use nn.ModuleList instead of a list: parameters not
updated / model.parameters() is missing layers"; DL-bug studies' "unregistered layer".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "unregistered_parameter", "boundary": "updates", "module": ""}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.hidden = [nn.Linear(32, 32) for _ in range(2)]  # the bug: a plain list
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.inp(x))
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.out(x)


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 8)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x[:, :1] * 2).backward()
            opt.step()
        return sentinel.report()
