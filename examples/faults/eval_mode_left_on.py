"""Fault: ``model.eval()`` is called for a validation pass and ``model.train()`` is never
called again, so dropout and batch norm stay in inference mode while training continues.

Source pattern: StackOverflow "forgot model.train() after evaluation"; PyTorch forums "BatchNorm
running stats not updating".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "eval_mode_training", "boundary": "forward", "module": ""}


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x_val = torch.randn(64, 10)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for step in range(steps):
            if step == 1:
                model.eval()  # the bug: a validation pass with no model.train() after it
                with torch.no_grad():
                    model(x_val)
            x = torch.randn(32, 10)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
