"""Fault: a binary classifier ends in ``nn.Sigmoid`` and feeds ``BCEWithLogitsLoss``, which
applies the sigmoid a second time.

Source pattern: StackOverflow "BCEWithLogitsLoss with sigmoid output: loss stuck around 0.69";
PyTorch forums "double sigmoid".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "probabilities_as_logits", "boundary": "loss", "module": "head.1"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(32, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def run(steps: int = 25, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    criterion = nn.BCEWithLogitsLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 10)
            opt.zero_grad()
            criterion(model(x), (x[:, :1] > 0).float()).backward()
            opt.step()
        return sentinel.report()
