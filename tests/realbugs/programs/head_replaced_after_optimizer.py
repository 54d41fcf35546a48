"""A pruning / surgery step replaces a layer of the model after the optimizer was built: the
optimizer still holds the old layer's tensors, the new layer gets gradients but is never
updated.

Source: microsoft/nni#4521 "The parameters are not updated when the pruned model is finetuned"
(speedup replaces the layers; "the parameters registered in the optimizer are outdated"),
https://github.com/microsoft/nni/issues/4521 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/microsoft/nni/issues/4521"
CLASS = "optimizer holds replaced (stale) parameters"
KIND, MODULE, CAUSE, ONSET = "unregistered_parameter", "2", None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model[2] = nn.Linear(32, 32)  # "speedup": a smaller/rewritten layer swapped in
    if not bug:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # the fix: rebuild it
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(32, 12, generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, :3]).argmax(1)).backward()
            opt.step()
            watch(s)
        return s.report()
