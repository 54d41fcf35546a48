"""Fine-tuning: the backbone is frozen and the optimizer is built from the backbone's
parameters instead of the new head's, so the optimizer holds only ``requires_grad=False``
tensors: ``Adam.step`` updates nothing, no error, the loss never moves.

Source: TrainCheck's reproduction PT-FORUM-84911 "No trainable layers exist" (invariant:
``Adam.step`` should lead to a parameter update), https://github.com/OrderLab/TrainCheck/blob/main/bugs.md .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "TrainCheck PT-FORUM-84911, https://github.com/OrderLab/TrainCheck/blob/main/bugs.md"
CLASS = "optimizer holds only frozen parameters"
KIND, MODULE, CAUSE, ONSET = "no_update", "backbone", None, 0


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Classifier()
    for p in model.backbone.parameters():
        p.requires_grad = False
    trainable = model.backbone.parameters() if bug else model.head.parameters()  # the bug
    opt = torch.optim.Adam(trainable, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(512, 20, generator=g)
    y_all = x_all[:, :4].argmax(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            idx = torch.randint(0, 512, (32,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
            watch(s)
        return s.report()
