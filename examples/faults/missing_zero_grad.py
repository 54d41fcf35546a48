"""Fault: ``optimizer.zero_grad()`` is never called, so gradients accumulate across steps.

Source pattern: StackOverflow "Why do we need to call zero_grad() in PyTorch?" / "loss
explodes after a few iterations"; DeepFD's "missing gradient reset".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "missing_zero_grad", "boundary": "gradients", "module": None}


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10, on_nonfinite="record") as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 10)
            loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            loss.backward()  # the bug: no zero_grad() anywhere in the loop
            opt.step()
        return sentinel.report()
