"""Fault: ``zero_grad()`` is called between ``backward()`` and ``step()``, so every step sees
no gradient and does nothing.

Source pattern: StackOverflow "loss not decreasing: optimizer.zero_grad() placed after
loss.backward()"; the seeds' Case B ("is step() called on real gradients?").
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "no_update", "boundary": "updates", "module": ""}


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 10)
            loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            loss.backward()
            opt.zero_grad()  # the bug: clears the gradients just computed
            opt.step()
        return sentinel.report()
