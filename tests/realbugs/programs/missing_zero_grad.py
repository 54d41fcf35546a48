"""The MNIST example loop with ``optimizer.zero_grad()`` left out: every step applies the sum of
all gradients so far, the effective step size grows with the step count and training goes wrong
without any error.

Source: TrainCheck's reproduction stackoverflow-60335387 "Missing call to optimizer.zero_grad"
(OrderLab/TrainCheck bugs.md), https://github.com/OrderLab/TrainCheck/blob/main/bugs.md ;
https://stackoverflow.com/questions/60335387 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "TrainCheck stackoverflow-60335387, https://github.com/OrderLab/TrainCheck/blob/main/bugs.md"
CLASS = "gradients accumulate across steps (zero_grad missing)"
KIND, MODULE, CAUSE, ONSET = "missing_zero_grad", None, "accumulating_gradients", 1


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(nn.functional.relu(self.conv(x)), 2)
        return nn.functional.log_softmax(self.fc(x.flatten(1)), dim=1)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(32, 1, 14, 14, generator=g)
            y = (x.mean((1, 2, 3)) > 0).long() * 3
            if not bug:
                opt.zero_grad()  # the fix; the bug is this line missing
            nn.functional.nll_loss(model(x), y).backward()
            opt.step()
            watch(s)
        return s.report()
