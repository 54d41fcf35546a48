"""Fault: plain SGD with a learning rate above 2 / (largest curvature) on a regression: every
step overshoots further and the loss grows geometrically, long before it becomes inf.

Source pattern: StackOverflow "loss increasing instead of decreasing with SGD" on unscaled
regression targets; UMLAUT "learning rate outside [1e-7, 0.01]".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "diverging", "boundary": "curves", "module": None}


def run(steps: int = 30, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.2)  # the bug: far above 2 / lambda_max
    w = torch.randn(8, 1)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(64, 8)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x @ w).backward()
            opt.step()
        return sentinel.report()
