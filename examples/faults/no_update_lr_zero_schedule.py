"""Fault: a warm-up schedule written with integer division keeps the learning rate at 0.

Source pattern: StackOverflow "LambdaLR warmup: loss never changes" (``lambda s: s // warmup``
is 0 for every step before ``warmup``); DeepDiagnosis "parameters unchanged".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "no_update", "boundary": "updates", "module": ""}


def run(steps: int = 30, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = 1000
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s // warmup)  # the bug: int division
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 10)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
            sched.step()
        return sentinel.report()
