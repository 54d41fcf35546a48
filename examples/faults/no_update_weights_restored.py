"""Fault: the weights are restored from a checkpoint inside the training loop, undoing every
optimizer step.

Source pattern: StackOverflow "model not learning: load_state_dict called every iteration"
(a resume block placed inside the loop); the seeds' Case B "updates overwritten or restored".
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "no_update", "boundary": "updates", "module": ""}


def run(steps: int = 30, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    checkpoint = copy.deepcopy(model.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            model.load_state_dict(checkpoint)  # the bug: "resume" runs every iteration
            x = torch.randn(32, 10)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x[:, :1]).backward()
            opt.step()
        return sentinel.report()
