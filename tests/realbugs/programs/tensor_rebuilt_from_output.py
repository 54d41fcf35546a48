"""The network's output is rebuilt into a fresh tensor before the loss (``torch.tensor(
out.tolist(), requires_grad=True)``, to post-process it in plain Python): backward stops at the
new leaf, every parameter's ``.grad`` stays None and the weights never change.

Source: pytorch/pytorch#1760 "Variable does not get gradient" (a tensor rebuilt from
``x.data.numpy()`` with ``requires_grad``), https://github.com/pytorch/pytorch/issues/1760 ;
isayev/ReLeaSE#39 "Weights are not updating" (the loss rebuilt through ``.numpy()``/``.item()``,
every grad None), https://github.com/isayev/ReLeaSE/issues/39 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/pytorch/issues/1760; https://github.com/isayev/ReLeaSE/issues/39"
CLASS = "graph cut between the model and the loss"
KIND, MODULE, CAUSE, ONSET = "no_gradient", "", None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(32, 8, generator=g)
            out = model(x)
            if bug:
                out = torch.tensor(out.tolist(), requires_grad=True)  # the bug
            opt.zero_grad()
            nn.functional.cross_entropy(out, x[:, :3].argmax(1)).backward()
            opt.step()
            watch(s)
        return s.report()
