"""Fault: ``MSELoss`` of a (B, 1) prediction against a (B,) target broadcasts to (B, B): the
model learns to predict the batch mean.

Source pattern: StackOverflow "UserWarning: Using a target size (torch.Size([64])) that is
different to the input size (torch.Size([64, 1]))" / "regression always predicts the mean".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "loss_broadcast", "boundary": "shapes", "module": None}


def run(steps: int = 15, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.MSELoss()
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(64, 6)
            y = x.sum(1)  # shape (64,): the bug, the model outputs (64, 1)
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
        return sentinel.report()
