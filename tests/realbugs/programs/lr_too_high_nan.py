"""A regression network trained with a learning rate ten times too high: the weights and
activations grow for a few steps, then the loss is inf/NaN. The NaN surfaces in the loss, but
the cause is the learning rate.

Source: karpathy/nanoGPT#136 "Loss becomes nan after training for ~2000 iterations" (fixed by
reducing the learning rate), https://github.com/karpathy/nanoGPT/issues/136 ;
BobLiu20/FaceRecognition_PyTorch#2 "With a learning rate of 0.1, loss is 'nan'",
https://github.com/BobLiu20/FaceRecognition_PyTorch/issues/2 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/karpathy/nanoGPT/issues/136; https://github.com/BobLiu20/FaceRecognition_PyTorch/issues/2"
CLASS = "learning rate far too high"
KIND, MODULE, CAUSE, ONSET = "non_finite", None, "learning_rate", 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1.0 if bug else 0.01)  # the bug: lr 100x
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(1024, 10, generator=g)
    y_all = (3 * x_all[:, :1] - 2 * x_all[:, 1:2]).tanh() * 4
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            idx = torch.randint(0, 1024, (32,), generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
            watch(s)
        return s.report()
