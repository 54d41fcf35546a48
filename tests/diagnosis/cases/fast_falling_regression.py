"""Healthy: a small model whose loss falls 1000x in 20 steps.

A linear regression on noiseless data, trained the way the PyTorch ``regression`` example
trains its polynomial fit (plain SGD at lr 0.1): the loss falls from 29 to about 0.001 within
the first 22 steps. The first steps move the weights by more than their own norm (they start
near zero, far from the optimum, on an easy quadratic surface): an update/weight ratio above
0.1 that is productive, not a learning rate too high. The loss history says so: it improves
fast and never rises beyond its own noise.

Source: issue 25 ("a small model whose loss falls 1000x in 20 steps");
https://github.com/pytorch/examples/blob/main/regression/main.py .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/examples/blob/main/regression/main.py"
CLASS = "a small model whose loss falls 1000x in 20 steps"
KIND, MODULE, CAUSE, ONSET = None, None, None, 0
LR = 0.1


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    w_target, b_target = torch.randn(8, 1, generator=g) * 2, 3.0
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(60):
            x = torch.randn(64, 8, generator=g)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), x @ w_target + b_target)
            loss.backward()
            opt.step()
            watch(s)
        return s.report()
