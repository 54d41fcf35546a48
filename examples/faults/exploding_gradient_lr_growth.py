"""Fault: a learning rate slightly too high for SGD on a deep tanh regressor: each step
overshoots, the weights grow, and the gradient norm grows by orders of magnitude step after
step on its way to inf.

Source pattern: StackOverflow "gradients explode then loss becomes NaN" (fixed by a lower lr or
clip_grad_norm_); AUTOTRAINER "exploding gradient".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "exploding_gradient", "boundary": "gradients", "module": None}


def run(steps: int = 16, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.6)  # the bug
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10, on_nonfinite="record") as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 8)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), 5 * x[:, :1] ** 2).backward()
            opt.step()
        return sentinel.report()
