"""Fault: Adam with lr 1.0 (an SGD-sized learning rate given to Adam): each step rewrites a
large fraction of every weight.

Source pattern: StackOverflow "Adam with lr=0.1 does not converge, SGD does" (copying an SGD
config to Adam); DeepDiagnosis "lr * ||dW|| / ||W|| outside [1e-5, 0.1]".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "update_ratio", "boundary": "updates", "module": "2"}


def run(steps: int = 35, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1.0)  # the bug
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10, update_every=5) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
