"""Fault: the encoder's output is ``.detach()``-ed before the head, so the encoder never gets
a gradient.

Source pattern: StackOverflow "encoder weights not updating: accidentally called detach()"
(often left over from a feature-extraction experiment); DeepLocalize "broken backprop path".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "no_gradient", "boundary": "gradients", "module": "encoder"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).detach())  # the bug


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
