"""An L-BFGS fit whose closure calls ``loss.backward()`` without ``optimizer.zero_grad()``: every
evaluation adds to the gradients of all earlier ones, the line search chases a gradient that
keeps growing, and the loss ends in inf/NaN.

Source: mohammadbashiri/fitgabor#1 review ("the whole thing should be inside the closure",
``optimizer.zero_grad()`` first), https://github.com/mohammadbashiri/fitgabor/pull/1 ;
pytorch/pytorch#5953 "LBFGS always give nan results", https://github.com/pytorch/pytorch/issues/5953 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/mohammadbashiri/fitgabor/pull/1; https://github.com/pytorch/pytorch/issues/5953"
CLASS = "gradients accumulate across steps (zero_grad missing)"
KIND, MODULE, CAUSE, ONSET = "missing_zero_grad", None, "accumulating_gradients", 1


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 10, generator=g)
    y = 2 * x[:, :1] - x[:, 1:2]
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            def closure() -> torch.Tensor:
                if not bug:
                    opt.zero_grad()  # the fix
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss
            opt.step(closure)
            watch(s)
        return s.report()
