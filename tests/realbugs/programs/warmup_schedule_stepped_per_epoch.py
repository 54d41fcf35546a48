"""A warm-up cosine schedule whose warm-up starts from a learning rate of 0 (MONAI's
``WarmupCosineSchedule``) is stepped once per epoch instead of once per iteration: the whole
first epoch runs at a learning rate of exactly 0, so its optimizer steps change nothing. The fix:
step the schedule every iteration (or start the warm-up above 0).

Source: Project-MONAI/MONAI#3989 "Add warmup_start_lr and eta_min to WarmupCosineSchedule" ("If
step() is only called after the first epoch ... it causes the entire first epoch to be executed
with a learning rate of zero"), https://github.com/Project-MONAI/MONAI/issues/3989 ;
Project-MONAI/tutorials#630 "Learning rate is zero for first epoch" (confirmed, fixed by revising
the scheduler usage), https://github.com/Project-MONAI/tutorials/issues/630 .
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/Project-MONAI/MONAI/issues/3989; https://github.com/Project-MONAI/tutorials/issues/630"
CLASS = "learning-rate schedule at exactly 0 for a whole epoch"
KIND, MODULE, CAUSE, ONSET = "no_update", "", None, 0
EPOCHS, BATCHES = 5, 10


def warmup_cosine(warmup_steps: int, t_total: int) -> Callable[[int], float]:
    """MONAI's WarmupCosineSchedule multiplier: linear from 0, then a cosine to 0."""
    def f(step: int) -> float:
        if step < warmup_steps:
            return step / max(1.0, warmup_steps)
        progress = (step - warmup_steps) / max(1, t_total - warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return f


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if bug:  # the bug: warm-up and horizon in epochs, stepped per epoch
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(2, 2 * EPOCHS))
    else:  # the fix: in iterations, stepped per iteration
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(2 * BATCHES, 2 * EPOCHS * BATCHES))
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(512, 16, generator=g)
    y_all = x_all[:, :4].argmax(1)
    with torch_sentinel.attach(model, opt) as s:
        for _epoch in range(EPOCHS):
            for _ in range(BATCHES):
                idx = torch.randint(0, 512, (32,), generator=g)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
                opt.step()
                watch(s)
                if not bug:
                    sched.step()
            if bug:
                sched.step()
        return s.report()
