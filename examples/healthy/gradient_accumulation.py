"""Healthy: gradient accumulation over 4 micro-batches per optimizer step.

Gradients add up across micro-batches *within* a step; zero_grad() runs once per step.
Expected: no fault findings (``report.ok``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = None


def run(steps: int = 40, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    w_true = torch.randn(8, 1)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    accum = 4
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _ in range(steps):
            opt.zero_grad()
            for _ in range(accum):
                x = torch.randn(16, 8)
                loss = nn.functional.mse_loss(model(x), x @ w_true) / accum
                loss.backward()
            opt.step()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
