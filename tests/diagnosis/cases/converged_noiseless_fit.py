"""Healthy: a noiseless fit that converges to float32's floor, after which the updates are tiny.

The regression of ``fast_falling_regression`` at lr 0.2: the loss falls from 29 to 1e-9 in about
25 steps and stays there. From then on the gradient is nearly 0, so each update is a tiny
fraction of the weights (an update/weight ratio near 1e-8). That is a converged fit, not a
learning rate too low: "too low" needs slow progress, and this loss fell by ten orders of
magnitude.

Source: issue 25 ("'too low' needs slow progress");
https://github.com/pytorch/examples/blob/main/regression/main.py .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/examples/blob/main/regression/main.py"
CLASS = "a converged fit whose updates become tiny"
KIND, MODULE, CAUSE, ONSET = None, None, None, 0
LR = 0.2


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
