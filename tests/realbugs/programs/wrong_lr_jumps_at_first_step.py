"""The uploaded training script carried a learning rate far larger than the one used for the
paper: the loss jumps after the very first update and never comes back (no NaN, just a
network that got thrown out of its basin at step 1).

Source: juntang-zhuang/LadderNet#1 "Loss getting too high" (the maintainer had uploaded the
wrong learning rate), https://github.com/juntang-zhuang/LadderNet/issues/1 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/juntang-zhuang/LadderNet/issues/1"
CLASS = "learning rate far too high"
KIND, MODULE, CAUSE, ONSET = "diverging", None, None, 1


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.5 if bug else 1e-3)  # the bug
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(512, 20, generator=g)
    y_all = x_all[:, :10].argmax(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            idx = torch.randint(0, 512, (64,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
            watch(s)
        return s.report()
