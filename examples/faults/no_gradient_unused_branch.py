"""Fault: an auxiliary branch is built and handed to the optimizer but never used in forward.

Source pattern: GitHub issues "Expected to have finished reduction in the prior iteration"
(DDP's find_unused_parameters error) — a layer defined in ``__init__`` and forgotten in
``forward``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "no_gradient", "boundary": "gradients", "module": "aux_head"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux_head = nn.Linear(32, 3)  # the bug: never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 10)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
